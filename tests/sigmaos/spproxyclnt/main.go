// A Go proc of sigma-supervise's tests that uses σOS's own client packages exactly as a σOS
// proc does: sigmaclnt.NewSigmaClnt(proc.GetProcEnv()) with ProcEnv.UseSPProxy, which dials
// /tmp/spproxyd/spproxyd.sock itself (proxy/sigmap/clnt) and sends Init with the ProcEnv.
// It runs as the target of sigma-supervise, whose embedded realm server must answer it the way
// spproxyd does. Each case prints "ok NAME" or "FAIL NAME: why"; the run ends with Exited(OK)
// when every case passed, else Exited(ERR).
//
// Built inside σOS's source tree (module sigmaos), never in this repository: the Rust test
// supervisor/tests/sigmaos_client.rs builds it through scripts/sigmaos-e2e --src-only.
//
// Started, Exited and WaitEvict go through σOS's spproxy stubs (SPProxyClnt.Started, ...):
// procclnt's own Started and Exited notify msched by an RPC on name/msched/KERNEL/rpc (through
// the spproxy connection when UseSPProxy is set), which a realm server without σOS has no msched
// to answer.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"sigmaos/proc"
	spproxyclnt "sigmaos/proxy/sigmap/clnt"
	"sigmaos/serr"
	"sigmaos/sigmaclnt"
	sp "sigmaos/sigmap"
	protsrv_proto "sigmaos/spproto/srv/proto"

	"google.golang.org/protobuf/proto"
)

// readWatch reads one record of a watch fd: [u32 LE length][WatchEventList].
func readWatch(spc *spproxyclnt.SPProxyClnt, wfd int) (*protsrv_proto.WatchEventList, error) {
	read := func(n int) ([]byte, error) {
		var b []byte
		for len(b) < n {
			buf := make([]byte, n-len(b))
			m, err := spc.Read(wfd, buf)
			if err != nil {
				return nil, err
			}
			if m == 0 {
				return nil, fmt.Errorf("watch read 0 bytes")
			}
			b = append(b, buf[:m]...)
		}
		return b, nil
	}
	hdr, err := read(4)
	if err != nil {
		return nil, err
	}
	body, err := read(int(binary.LittleEndian.Uint32(hdr)))
	if err != nil {
		return nil, err
	}
	evs := &protsrv_proto.WatchEventList{}
	return evs, proto.Unmarshal(body, evs)
}

var failed int

func check(name string, ok bool, why ...interface{}) {
	if ok {
		fmt.Printf("ok %s\n", name)
		return
	}
	failed++
	fmt.Printf("FAIL %s: %v\n", name, why)
}

func names(sts []*sp.Tstat) string {
	var ns []string
	for _, st := range sts {
		ns = append(ns, st.Name)
	}
	sort.Strings(ns)
	return strings.Join(ns, ",")
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: spproxyclnt BUCKET")
		os.Exit(2)
	}
	bucket := os.Args[1]
	pe := proc.GetProcEnv()
	check("ProcEnv UseSPProxy", pe.UseSPProxy, pe)
	sc, err := sigmaclnt.NewSigmaClnt(pe)
	if err != nil {
		fmt.Printf("FAIL NewSigmaClnt: %v\n", err)
		os.Exit(1)
	}
	check("NewSigmaClnt", true)
	spc, ok := sc.FsLib.GetSigmaOS().(*spproxyclnt.SPProxyClnt)
	if !ok {
		fmt.Printf("FAIL the FileAPI is not spproxy's client: %T\n", sc.FsLib.GetSigmaOS())
		os.Exit(1)
	}
	check("Started", spc.Started() == nil)

	// Files in the realm's scratch directory.
	ux := "name/ux/~local/goproc"
	err = sc.MkDir(ux, 0777)
	check("MkDir", err == nil, err)
	data := []byte("hello from σOS's own Go client")
	n, err := sc.PutFile(ux+"/hello", 0777, sp.OWRITE, data)
	check("PutFile", err == nil && int(n) == len(data), n, err)
	got, err := sc.GetFile(ux + "/hello")
	check("GetFile", err == nil && bytes.Equal(got, data), string(got), err)
	st, err := sc.Stat(ux + "/hello")
	check("Stat", err == nil && st.LengthUint64() == uint64(len(data)) && st.Name == "hello", st, err)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	n, err = sc.PutFile(ux+"/big", 0777, sp.OWRITE, big)
	check("PutFile 4 MiB", err == nil && int(n) == len(big), n, err)
	got, err = sc.GetFile(ux + "/big")
	check("GetFile 4 MiB", err == nil && bytes.Equal(got, big), len(got), err)
	_, err = sc.Stat(ux + "/missing")
	check("a missing file is Notfound", serr.IsErrCode(err, serr.TErrNotfound), err)
	_, err = sc.PutFile(ux+"/hello", 0777, sp.OWRITE|sp.OEXCL, data)
	check("PutFile OEXCL on an existing file is Exists", serr.IsErrCode(err, serr.TErrExists), err)
	sts, err := sc.GetDir(ux)
	check("GetDir", err == nil && names(sts) == "big,hello", names(sts), err)
	isdir, err := sc.IsDir(ux)
	check("IsDir", err == nil && isdir, err)

	// A watch on the directory: a file created after it is an event. Read the way
	// fslib/dirwatcher reads it ([u32 LE length][WatchEventList]), on this goroutine:
	// dirwatcher's own reader goroutine cannot be stopped through spproxy (a Read that fails,
	// as on a closed fd, dereferences a nil IoVec in SPProxyClnt.Read), so it is not used.
	dfd, err := sc.Open(ux, sp.OREAD)
	check("Open a directory", err == nil, err)
	wfd, err := spc.DirWatch(dfd)
	check("DirWatch", err == nil, err)
	if err == nil {
		_, err = sc.PutFile(ux+"/new", 0777, sp.OWRITE, []byte("x"))
		check("PutFile while watched", err == nil, err)
		ev, err := readWatch(spc, wfd)
		check("DirWatch event", err == nil && len(ev.Events) == 1 && ev.Events[0].File == "new" &&
			ev.Events[0].Type == protsrv_proto.WatchEventType_CREATE, ev, err)
		check("CloseFd of the watch", spc.CloseFd(wfd) == nil)
	}
	// A read parked on a watch that is closed meanwhile ends with no bytes and no error, as
	// σOS's watch answers it (any failed Read would crash SPProxyClnt.Read).
	wfd, err = spc.DirWatch(dfd)
	check("DirWatch again", err == nil, err)
	if err == nil {
		done := make(chan error)
		go func() {
			n, err := spc.Read(wfd, make([]byte, 64))
			if err == nil && n != 0 {
				err = fmt.Errorf("%d bytes", n)
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		check("CloseFd of a watch being read", spc.CloseFd(wfd) == nil)
		select {
		case err := <-done:
			check("a parked watch read ends with no bytes when closed", err == nil, err)
		case <-time.After(5 * time.Second):
			check("a parked watch read ends with no bytes when closed", false, "still parked after 5 s")
		}
	}
	check("CloseFd of the directory", spc.CloseFd(dfd) == nil)
	for _, f := range []string{"hello", "big", "new"} {
		err = sc.Remove(ux + "/" + f)
		check("Remove "+f, err == nil, err)
	}
	err = sc.Remove(ux)
	check("Remove the directory", err == nil, err)
	_, err = sc.Stat(ux)
	check("a removed directory is Notfound", serr.IsErrCode(err, serr.TErrNotfound), err)

	// Objects in the tenant's bucket.
	s3 := "name/s3/~local/" + bucket + "/goproc"
	n, err = sc.PutFile(s3+"/obj", 0777, sp.OWRITE, data)
	check("S3 PutFile", err == nil && int(n) == len(data), n, err)
	got, err = sc.GetFile(s3 + "/obj")
	check("S3 GetFile", err == nil && bytes.Equal(got, data), string(got), err)
	st, err = sc.Stat(s3 + "/obj")
	check("S3 Stat", err == nil && st.LengthUint64() == uint64(len(data)), st, err)
	sts, err = sc.GetDir(s3)
	check("S3 GetDir", err == nil && names(sts) == "obj", names(sts), err)
	err = sc.Remove(s3 + "/obj")
	check("S3 Remove", err == nil, err)
	_, err = sc.GetFile(s3 + "/obj")
	check("a removed object is Notfound", serr.IsErrCode(err, serr.TErrNotfound), err)

	// Eviction: the test sends the supervisor SIGTERM once this line is out.
	fmt.Println("waiting for eviction")
	err = spc.WaitEvict()
	check("WaitEvict", err == nil, err)

	status, msg := proc.StatusOK, "all cases passed"
	if failed > 0 {
		status, msg = proc.StatusErr, fmt.Sprintf("%d cases failed", failed)
	}
	err = spc.Exited(status, msg)
	check("Exited", err == nil, err)
	err = sc.FsLib.Close()
	check("Close", err == nil, err)
	if failed > 0 {
		os.Exit(1)
	}
}
