#!/usr/bin/env python3
"""Time from a SIGKILLed worker to training resumed, under burn-ddp-run
--max-restarts with --resume auto (the toy trainer and mnist --learner).

    python3 scripts/restart-bench.py [--target target/debug] [--data ../shared/data/mnist]

Prints one line per run: the program, where the kill landed, the seconds
from the kill to the first line of the new round and to the resumed message,
and the work redone (epochs past the last snapshot).
"""
import argparse, os, signal, subprocess, sys, tempfile, threading, time

def worker_pid(launcher, rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if ppid == launcher and f"RANK={rank}".encode() in env:
            return int(pid)
    return None

def run(cmd, cwd, kill_after, resumed_marker):
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    stamps = {}
    def read():
        for line in proc.stdout:
            now = time.monotonic()
            lines.append((now, line.rstrip()))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not any(kill_after in l for _, l in lines):
        if proc.poll() is not None:
            sys.exit(f"ended before {kill_after!r}: {lines}")
        time.sleep(0.005)
    victim = worker_pid(proc.pid, 1)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=600)
    reader.join(timeout=10)
    first = next(t for t, l in lines if t > killed and "round 1]" in l)
    resumed = next(t for t, l in lines if t > killed and resumed_marker in l)
    return first - killed, resumed - killed, [l for _, l in lines]

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="target/debug")
    parser.add_argument("--data", default="../shared/data/mnist")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    launcher = os.path.abspath(os.path.join(args.target, "burn-ddp-run"))
    examples = os.path.abspath(os.path.join(args.target, "examples"))
    base = [launcher, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--prefix-output"]
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as dir:
            toy = base + [f"{examples}/toy", "--epochs", "6", "--batch-size", "2", "--save-interval", "1", "--resume", "auto"]
            first, resumed, lines = run(toy, dir, "[rank 0 round 0] Epoch 3/6", "[rank 0 round 1] Resumed from")
            back = next(l for l in lines if "round 1] Resumed from" in l).rsplit(" ", 1)[1]
            print(f"toy 2 ranks, killed after epoch 3: new round {first:.2f}s, resumed {resumed:.2f}s after the kill, resumed at epoch {back}")
    data = os.path.abspath(args.data)
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as dir:
            mnist = base + [f"{examples}/mnist", "--learner", "--data-dir", data, "--train-samples", "1024",
                            "--test-samples", "128", "--batch-size", "8", "--epochs", "2", "--artifact-dir", "art", "--resume", "auto"]
            proc_lines = None
            first, resumed, lines = run(mnist, dir, "[rank 0 round 0] epoch=1 ", "[rank 0 round 1] resuming after epoch")
            epoch_time = next(l for l in lines if "round 0] epoch=1 " in l).rsplit("epoch_time=", 1)[1]
            print(f"mnist --learner 2 ranks, killed right after epoch 1 ({epoch_time} an epoch): new round {first:.2f}s, resumed {resumed:.2f}s after the kill")

main()
