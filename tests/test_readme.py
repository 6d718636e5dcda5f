"""The README's commands work as printed.

The first ten minutes with the project are the README: every command it
shows must exist as written. This test reads the README the way a newcomer
does -- the fenced `bash` blocks and the `command` column of its tables --
and checks each command against the real thing: `specgate` sub-commands and
flags against the typer app itself, `make` targets against the Makefile
(`make -n`, which runs nothing), scripts, modules and paths against the
tree, and it runs the quick ones (`--version`, `profile show`, `config-doc`,
`hash-key`) for real. What `specgate up` prints is checked against the same
rules (and pasted for real against a live stack in tests/specgate/test_up.py).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import specgate
from specgate.cli import app

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()

# Commands cheap enough to run for real (the argv after `specgate`).
QUICK = {("--version",), ("config-doc",), ("profile", "show"), ("hash-key",)}


def fenced_commands(text: str) -> list[str]:
    """Lines of the ```bash blocks, comments dropped, continuations joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def table_cells(text: str, header: str) -> list[str]:
    """The inline-code first cells of the tables whose first column is `header`."""
    cells, in_table = [], False
    for line in text.splitlines():
        if line.startswith(f"| {header} |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if in_table and not line.startswith("|---"):
            m = re.match(r"\|\s*`([^`]+)`", line)
            if m:
                cells.append(m.group(1))
    return cells


def readme_commands() -> list[str]:
    return fenced_commands(README) + table_cells(README, "command")


def simple_commands(line: str) -> list[list[str]]:
    """A shell line as its simple commands (split on && and |), env assignments dropped,
    optional `[...]` groups kept as plain words (each documented flag must exist)."""
    out = []
    for part in re.split(r"&&|\|", line.replace("[", " ").replace("]", " ")):
        words = shlex.split(part)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        if words:
            out.append(words)
    return out


def check_specgate(args: list[str]) -> None:
    """Sub-commands and flags exist in the real CLI; quick commands run."""
    group = typer.main.get_command(app)
    cmd, path = group, []
    rest = list(args)
    while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
        path.append(rest[0])
        cmd = cmd.commands[rest.pop(0)]
    known = {opt for p in cmd.params for opt in (*p.opts, *getattr(p, "secondary_opts", ()))}
    for word in rest:
        if word.startswith("-"):
            assert word.split("=")[0] in known, f"`specgate {' '.join(args)}`: {word} is not an option of `specgate {' '.join(path)}`"
    assert path or rest == ["--version"], f"`specgate {' '.join(args)}`: no such sub-command"
    runner = CliRunner()
    r = runner.invoke(app, [*path, "--help"])
    assert r.exit_code == 0, r.output
    if tuple(path) in QUICK or tuple(rest) in QUICK:
        r = runner.invoke(app, args)
        assert r.exit_code == 0, f"`specgate {' '.join(args)}` failed: {r.output}"


def check_command(words: list[str]) -> None:
    exe, args = words[0], words[1:]
    if exe == ".venv/bin/specgate":
        check_specgate(args)
    elif exe == ".venv/bin/python":
        if args[0] == "-m":
            assert importlib.util.find_spec(args[1]) is not None, f"no module {args[1]}"
        else:
            assert (REPO / args[0]).is_file(), f"no script {args[0]}"
    elif exe == "make":
        targets = [a for a in args if "=" not in a]
        variables = [a for a in args if "=" in a]
        r = subprocess.run(["make", "-n", *targets, *variables], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"`make {' '.join(args)}`: {r.stderr}"
    elif exe == "cp":
        assert (REPO / args[0]).is_file(), f"no file {args[0]}"
    elif exe == "docker":
        assert (REPO / "docker-compose.yml").is_file()
    elif exe == "kubectl" and args[:2] == ["apply", "-k"]:
        from tests.stack.k8s_manifests import kustomize

        assert kustomize(REPO / args[2]), f"{args[2]} renders no objects"  # renders with the real kubectl
    elif "/" in exe:
        assert (REPO / exe).is_file(), f"no script {exe}"
    else:
        raise AssertionError(f"README command {' '.join(words)!r}: this test does not know how to check {exe!r}")


def test_readme_has_the_commands_a_newcomer_needs():
    commands = readme_commands()
    assert "make run" in commands and "make test" in commands
    assert any(c.startswith("make run PORT=") for c in commands)
    assert ".venv/bin/specgate --version" in commands
    # Every executable is the project's own: plain `python`/`specgate` may not be on PATH (or not this one).
    for line in commands:
        for words in simple_commands(line):
            assert words[0] not in ("python", "python3", "specgate", "pip"), line


@pytest.mark.parametrize("line", readme_commands())
def test_every_readme_command_exists_as_printed(line):
    if line.startswith("make ") and shutil.which("make") is None:
        pytest.skip("make is not installed")
    for words in simple_commands(line):
        check_command(words)


def test_every_path_the_readme_names_exists():
    linked = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    listed = [c for cell in table_cells(README, "path") for c in re.split(r"`,\s*`", cell)]
    inline = re.findall(r"`((?:docs|tests|bench|scripts|docker|contract|gateway|controller|drafters|specgate)/[\w./-]*)`", README)
    paths = {p for p in (*linked, *listed, *inline) if "://" not in p}
    assert len(paths) > 15
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"specgate {version('specgate')}" == f"specgate {specgate.__version__}"


def test_python_requirement_is_stated_where_pip_and_people_read_it():
    import tomllib

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert "Python **3.11 or newer**" in README


def test_what_specgate_up_prints_names_this_installations_executables(monkeypatch):
    """The banner's SDK example and load hint name executables that exist
    from where `make run` runs (the repository root), not bare `python`."""
    from specgate.up import banner, make_plan

    monkeypatch.chdir(REPO)
    plan = make_plan(replica_ports=(1, 2, 3), token=lambda n: "x" * n)
    text = banner(plan, "Qwen/Qwen3-8B")
    commands = [c.strip() for c in text.split("Try it:", 1)[1].replace("\\\n", " ").splitlines() if c.strip()]
    commands = [c for c in commands if not c.startswith("Ctrl-C")]
    exes = {c.split()[0] for c in commands}
    assert exes == {"curl", ".venv/bin/python", ".venv/bin/specgate"}, exes
    for exe in exes - {"curl"}:
        assert (REPO / exe).exists(), exe
    load = next(c for c in commands if c.startswith(".venv/bin/specgate"))
    check_specgate(shlex.split(re.sub(r"\s+#.*$", "", load))[1:])
    assert "http://127.0.0.1:8080" in text  # the documented default port
