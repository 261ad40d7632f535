"""`ppf completion bash|zsh|fish` (argcomplete): the script a shell loads, and bash, with
it loaded, completing ppf's commands and a command's flags."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _ppf(*argv: str) -> str:
    out = subprocess.run([str(BIN / "ppf"), *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="apt-get install bash")
def test_bash_completes_commands_and_flags_from_the_script() -> None:
    """With `ppf completion bash` sourced, bash completes `ppf ser` to `serve` and `ppf
    serve --wor` to `--workers`, as a user's tab would."""
    script = _ppf("completion", "bash")
    assert "complete" in script and "ppf" in script

    def tab(line: str) -> list[str]:
        words = line.split(" ")
        probe = (
            f'source /dev/stdin <<"EOF"\n{script}\nEOF\n'
            f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; "
            f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
            f"_python_argcomplete ppf {words[-1]!r} {words[-2]!r}\n"
            'printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env)
        return [w.strip() for w in out.stdout.splitlines() if w.strip()]

    assert "serve" in tab("ppf ser")
    assert tab("ppf serve --wor") == ["--workers"]
    assert "up" in tab("ppf u")


def test_zsh_and_fish_scripts_name_ppf() -> None:
    """zsh's and fish's scripts are argcomplete's, registered for ppf; an unknown shell
    is refused by name."""
    assert "#compdef ppf" in _ppf("completion", "zsh")
    assert "complete --command ppf" in _ppf("completion", "fish")
    bad = subprocess.run([str(BIN / "ppf"), "completion", "tcsh"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
