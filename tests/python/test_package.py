"""The package's face: what `import tunedist` alone gives a user."""

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_tool_subpackages_load_on_first_use():
    out = _run(
        "import sys, tunedist\n"
        "names = ('hooks', 'tune', 'doctor', 'bench')\n"
        "print([f'tunedist.{n}' in sys.modules for n in names])\n"
        "print(callable(tunedist.hooks.register), callable(tunedist.tune.ddp), tunedist.doctor.__name__,\n"
        "      tunedist.bench.__name__)\n"
        "print(set(names) <= set(dir(tunedist)))\n"
    )
    lines = out.splitlines()
    assert lines[0] == "[False, False, False, False]", out
    assert lines[1] == "True True tunedist.doctor tunedist.bench", out
    assert lines[2] == "True", out


def test_unknown_attribute_is_an_attribute_error():
    out = _run(
        "import tunedist\n"
        "try:\n"
        "    tunedist.no_such_thing\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    assert out.strip() == "module 'tunedist' has no attribute 'no_such_thing'"
