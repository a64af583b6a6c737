"""tools/venv.sh hands uv pip's own indexes, links, constraints and certificate, and leaves the install to pip when
pip's configuration sets anything else or uv fails. A stand-in .venv/bin/python answers `-m pip config list` with
the configuration under test and records what `-m uv pip install` was given (the real install is CI's own setup)."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAND_IN = """#!/usr/bin/env bash
case "$*" in
  "-m pip config list") cat "$HERE/config" ;;
  "-m pip install"*) ;;
  "-m uv pip install"*) printf '%s\\n' "SSL_CERT_FILE=${SSL_CERT_FILE:-}" "$@" > "$HERE/uv_args"
    exit "$(cat "$HERE/uv_rc")" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def uv_install(tmp_path: Path, config: str, uv_rc: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    (tmp_path / "config").write_text(config)
    (tmp_path / "uv_rc").write_text(str(uv_rc))
    (tmp_path / "uv_args").unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", f"source {REPO / 'tools' / 'venv.sh'} && uv_install '[dev]'"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HERE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    args = (tmp_path / "uv_args").read_text().splitlines() if (tmp_path / "uv_args").exists() else []
    return done, args


def test_pips_indexes_links_constraints_and_certificate_reach_uv(tmp_path):
    done, args = uv_install(
        tmp_path,
        "global.index-url='https://mirror.example/simple'\n"
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
        "global.find-links='/opt/wheels'\n"
        ":env:.constraint='/etc/pip/constraints.txt'\n"
        "global.cert='/etc/ssl/mine.pem'\n"
        ":env:.default-timeout='180'\n"
        "download.dest='/elsewhere'\n"  # another pip command's section: not the install's
        "wheel.find-links='/not/for/install'\n",
    )
    assert done.returncode == 0, done.stderr
    assert args[0] == "SSL_CERT_FILE=/etc/ssl/mine.pem"
    # byte-compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) every
    # process would compile torch again (measured: the suite 14.5 -> 23 min)
    assert args[1:7] == ["-m", "uv", "pip", "install", "-q", "--compile-bytecode"]
    flags = list(zip(args[7:-2:2], args[8:-2:2]))
    assert flags == [
        ("--python", ".venv/bin/python"),
        ("--index-strategy", "unsafe-best-match"),  # pip's: the best version over every index
        ("--index-url", "https://mirror.example/simple"),
        ("--extra-index-url", "file:///opt/a/simple"),
        ("--extra-index-url", "file:///opt/b/simple"),
        ("--find-links", "/opt/wheels"),
        ("--constraint", "/etc/pip/constraints.txt"),
    ]
    assert args[-2:] == ["-e", ".[dev]"]


def test_a_setting_uv_is_not_given_leaves_the_install_to_pip(tmp_path):
    done, args = uv_install(tmp_path, "global.find-links='/opt/wheels'\n:env:.pre='1'\n")
    assert done.returncode == 1 and args == []
    assert done.stderr.strip() == "venv: pip's configuration sets pre, which uv is not given: installing with pip"


def test_a_failing_uv_leaves_the_install_to_pip(tmp_path):
    done, args = uv_install(tmp_path, "", uv_rc=2)
    assert done.returncode == 1 and args[-2:] == ["-e", ".[dev]"]
    assert "uv could not install .[dev]: installing with pip" in done.stderr
    assert args[0] == "SSL_CERT_FILE="  # none configured, none set
