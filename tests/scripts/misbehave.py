"""A tiny seeded training loop that misbehaves the way argv[1] says (reliability tests).

The loop never calls zero_grad (a missing-zero-grad bug at the line marked BUG-LINE), so every
run that gets past two steps has a finding to report. Misbehaviour starts before the first
step ("raise-before") or after three steps (the others).
"""
import ctypes
import itertools
import os
import subprocess
import sys
import threading
import time

import torch
from torch import nn

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
torch.manual_seed(0)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if mode == "raise-before":
    raise RuntimeError("failed before any step")
if mode == "stdin":
    print("read from stdin:", repr(sys.stdin.read()))


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no message for you")


def misbehave():
    if mode == "raise-after":
        raise ValueError("failed after 3 steps")
    if mode == "unprintable":
        raise Unprintable()
    if mode == "exit0":
        sys.exit(0)
    if mode == "exit3":
        sys.exit(3)
    if mode == "exit-message":
        sys.exit("bad configuration")
    if mode == "os-exit":
        os._exit(0)
    if mode == "keyboard":
        raise KeyboardInterrupt
    if mode == "hang":
        while True:
            pass
    if mode == "swallow-hang":  # catches everything, graddoctor's stop included
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass
    if mode == "c-hang":  # a dead lock inside C code that releases the interpreter lock
        mutex = ctypes.create_string_buffer(64)
        libc = ctypes.CDLL(None)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)
    if mode == "gil-hang":  # a C loop that holds the interpreter lock
        sum(itertools.repeat(1, 10**15))
    if mode == "thread":  # a non-daemon thread that never ends
        threading.Thread(target=lambda: [time.sleep(0.1) for _ in iter(int, 1)]).start()
    if mode == "chdir":
        os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


for i in range(1000 if mode in ("catch-all", "print-lots") else 6):
    if i == 3:
        misbehave()
    if mode == "print-lots":
        print(f"step {i} " + "x" * 2000)
        os.write(1, b"written to file descriptor 1\n")
        subprocess.run(["echo", "a child process writes to stdout"])
    try:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()  # BUG-LINE: no zero_grad anywhere
        optimizer.step()
    except Exception as exc:  # a broad catch must not swallow graddoctor's stop
        if mode != "catch-all":
            raise
        print("ignored", exc)
print("finished")
