#!/usr/bin/env bash
# MinIO for tests and demos.
#
#   scripts/minio.sh install            build the pinned release into $SIGMA_CACHE/bin (instant if present)
#   scripts/minio.sh path               print the binary's path (fails if not installed)
#   scripts/minio.sh start DIR PORT     start on 127.0.0.1:PORT (console on PORT+1, or $MINIO_CONSOLE_PORT)
#                                       with data in DIR/data; wait until ready; print the endpoint
#   scripts/minio.sh stop DIR           stop the server started with DIR
#
# Credentials: MINIO_ROOT_USER / MINIO_ROOT_PASSWORD (default minioadmin / minioadmin).
set -euo pipefail

# Pinned: MinIO has no semver tags; this pseudo-version is the release the tests were written against.
MINIO_MODULE="github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
CACHE="${SIGMA_CACHE:-$HOME/.cache/sigma-ci}"
BIN="$CACHE/bin/minio"

die() { echo "minio.sh: $*" >&2; exit 1; }

cmd="${1:-}"
case "$cmd" in
install)
    if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi
    command -v go >/dev/null || die "go is not installed (needed to build MinIO)"
    mkdir -p "$CACHE/bin"
    echo "building $MINIO_MODULE (takes ~4 min cold)..." >&2
    GOBIN="$CACHE/bin" GOFLAGS="-trimpath" go install "$MINIO_MODULE"
    [[ -x "$BIN" ]] || die "go install finished but $BIN is missing"
    echo "$BIN"
    ;;
path)
    [[ -x "$BIN" ]] || die "$BIN missing: run scripts/minio.sh install"
    echo "$BIN"
    ;;
start)
    dir="${2:-}"; port="${3:-}"
    [[ -n "$dir" && "$port" =~ ^[0-9]+$ ]] || die "usage: minio.sh start DIR PORT"
    [[ -x "$BIN" ]] || die "$BIN missing: run scripts/minio.sh install"
    console="${MINIO_CONSOLE_PORT:-$((port + 1))}"
    mkdir -p "$dir/data"
    export MINIO_ROOT_USER="${MINIO_ROOT_USER:-minioadmin}"
    export MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-minioadmin}"
    if [[ -f "$dir/minio.pid" ]] && kill -0 "$(cat "$dir/minio.pid")" 2>/dev/null; then
        die "already running with pid $(cat "$dir/minio.pid") for $dir"
    fi
    nohup "$BIN" server --quiet --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
        "$dir/data" >"$dir/minio.log" 2>&1 &
    echo $! >"$dir/minio.pid"
    for _ in $(seq 1 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
            curl -fsS -o /dev/null "http://127.0.0.1:$port/minio/health/ready" 2>/dev/null; then
            echo "http://127.0.0.1:$port"
            exit 0
        fi
        kill -0 "$(cat "$dir/minio.pid")" 2>/dev/null || die "minio exited: $(tail -5 "$dir/minio.log")"
        sleep 0.1
    done
    die "minio not ready on 127.0.0.1:$port after 30 s (log: $dir/minio.log)"
    ;;
stop)
    dir="${2:-}"
    [[ -f "$dir/minio.pid" ]] || die "no $dir/minio.pid"
    pid="$(cat "$dir/minio.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$dir/minio.pid"
    ;;
*)
    die "usage: minio.sh install | path | start DIR PORT | stop DIR"
    ;;
esac
