"""signal: alarm, setitimer/getitimer, pause, sigwait, pthread_kill, pending signals."""
import os, signal, threading, time

got = []
signal.signal(signal.SIGALRM, lambda s, f: got.append("alarm"))
print("alarm returns", signal.alarm(1))
signal.pause()
print("after pause", got)
signal.setitimer(signal.ITIMER_REAL, 0.2)
delay, interval = signal.getitimer(signal.ITIMER_REAL)
print("getitimer", 0 < delay <= 0.2, interval)
signal.pause()
print("itimer", got)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
os.kill(os.getpid(), signal.SIGUSR1)
print("pending", signal.sigpending() == {signal.SIGUSR1})
print("sigwait", signal.sigwait({signal.SIGUSR1}) == signal.SIGUSR1)
print("sigtimedwait", signal.sigtimedwait({signal.SIGUSR1}, 0.1))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
signal.signal(signal.SIGUSR2, lambda s, f: got.append("usr2"))
signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
print("pthread_kill", got[-1])
signal.raise_signal(signal.SIGUSR2)
print("raise", got.count("usr2"))


def on_alarm(s, f):
    raise TimeoutError("alarm timeout")


signal.signal(signal.SIGALRM, on_alarm)
signal.alarm(1)
try:
    threading.Event().wait(30)
except TimeoutError as e:
    print("alarm-based timeout:", e)
print("nice", os.nice(0) >= 0, os.nice(1) >= 1)
print("getpriority", os.getpriority(os.PRIO_PROCESS, 0) >= 1)
