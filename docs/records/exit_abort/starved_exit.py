"""Launches `starved` N times per label (dropin, native, torch, torch_world; "@tuned" for the tuned backend) with
three busy loops on the host; prints each launch that failed and the count."""

import subprocess
import sys

import starved_exit_workers as m

from dist_utils import LaunchError, launch

if __name__ == "__main__":
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    fails = 0
    try:
        for _ in range(int(sys.argv[1])):
            for label in sys.argv[2].split(","):
                try:
                    launch(2, m.starved, label, backend="tuned" if label.endswith("@tuned") else "gloo")
                except LaunchError as e:
                    fails += 1
                    print(label, str(e)[:300])
    finally:
        for h in hogs:
            h.kill()
    print("fails", fails)
