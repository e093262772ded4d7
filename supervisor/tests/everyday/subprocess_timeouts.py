"""subprocess: run, pipes, timeouts, terminate/kill, new sessions, process groups."""
import os, signal, subprocess, sys

r = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True)
print("run", r.returncode, r.stdout.strip())
r = subprocess.run(["sh", "-c", "echo out; echo err >&2; exit 3"], capture_output=True, text=True)
print("sh", r.returncode, r.stdout.strip(), r.stderr.strip())
try:
    subprocess.run(["sleep", "30"], timeout=0.5)
except subprocess.TimeoutExpired as e:
    print("timeout", e.cmd)
try:
    subprocess.check_output([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
except subprocess.TimeoutExpired:
    print("check_output timeout")
p = subprocess.Popen(["sleep", "30"])
p.terminate()
print("terminate", p.wait(10))
p = subprocess.Popen(["sleep", "30"])
p.kill()
print("kill", p.wait(10))
p = subprocess.Popen(["sleep", "30"], start_new_session=True)
print("new session", os.getsid(p.pid) == p.pid)
os.killpg(p.pid, signal.SIGTERM)
print("killpg", p.wait(10))
p = subprocess.Popen(["sleep", "30"], process_group=0)
print("process group", os.getpgid(p.pid) == p.pid)
p.send_signal(signal.SIGINT)
print("sigint", p.wait(10))
out = subprocess.run("echo $((6 * 7)) | cat", shell=True, capture_output=True, text=True).stdout
print("shell pipe", out.strip())
p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print("communicate", p.communicate(b"hello", timeout=30)[0])
