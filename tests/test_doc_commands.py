"""Every command line the docs quote parses with the real parser of that command.

Why: README.md, docs/*.md and the comments of scheduler-config/ quote many command lines
(``stowage plan --simulated --fill 60 ...``, ``python -m benchmarks.binpack.real --seeds 42,43 ...``,
``make bench-latency``). Flags get renamed and values get stricter over the sessions, and a user who
copies a stale line gets an error. This test finds each quoted line and hands its arguments to the
parser the command itself uses, WITHOUT running the command:

- ``stowage ...``: click's own parsing (``make_context`` of the group, then of the subcommand;
  nothing is invoked), so unknown flags, missing values and refused values (``IntRange``,
  ``Choice``, the ``--bind`` check) fail here as they would for the user;
- ``python -m benchmarks.X`` and ``python tests/fuzzing.py``: ``parse_args`` of the
  ``build_parser()`` that the command's ``main`` uses (:data:`ARGPARSE_PARSERS`;
  ``test_each_checked_parser_is_the_one_its_command_uses`` ties the two together);
- ``make X``: X is a target of the Makefile.

Every check a command makes of its command line alone is made by its parser (a pod shape of
``stowage plan``/``inspect``, ``--preempt`` without ``--priority``, ``benchmarks.latency --workers
0``, ``benchmarks.binpack.real --no-replay`` without a burst: click callbacks and
``stowage.clickcheck.CheckedCommand``, argparse types and ``benchmarks.cliargs.CheckedParser``),
so it is made here too (:func:`test_a_check_of_the_command_line_alone_is_made_while_parsing`).
What needs more than the command line (a trace file on disk, a key file's content, the cluster's
nodes for ``inspect --node``) is left to the command.

What counts as a quoted command line (kept simple on purpose, see :func:`quoted_commands`): each
line of a fenced code block in markdown (``\\`` continuations joined; an alternative in its comment,
``# or: stowage demo --pods 150``, counts too), each inline code span in markdown (a span may wrap
onto the next line of its paragraph), and in YAML comments each code span and each bare
``stowage SUBCOMMAND --flag ...`` up to the first ``)``, ``,`` or ``;`` (the flag makes it a
command line rather than a sentence about the command). A line counts when, after an optional
``$`` prompt, ``sudo``, ``time`` and ``VAR=value`` prefixes, it starts with ``stowage`` or
``make`` followed by something (bare, they are the project's, the policy's or the tool's name),
``tests/fuzzing.py`` or a ``python`` that runs ``-m benchmarks...`` or ``tests/fuzzing.py`` (any
other ``python -m`` is not ours to check). The command ends at the first shell operator (``|``,
``&``, ``;``, ``>``, ...) or ``#`` comment.

Argparse flags are checked without abbreviations (``--seed`` for ``--seeds`` is refused): argparse
would take one today, but a doc should name the flag itself, and an abbreviation breaks as soon as
another flag shares its prefix.

What is substituted before parsing (the docs use these conventions; see :func:`arguments`):

- ``[...]`` marks optional arguments: the brackets are dropped, the arguments are checked;
- ``...`` ("more arguments here") is dropped;
- a placeholder (``FILE``, ``N``, ``SHAPE``, ...) takes a value of its kind from
  :data:`PLACEHOLDERS`; any other word of two or more capitals and no digit (unlike ``H100``) fails
  the test as an unknown placeholder, so a new one is a conscious addition;
- an absolute, home or ``./`` path that does not exist on this machine
  (``/etc/stowage/tls/server.crt``, ``~/.kube/config``) becomes an existing file (this one), so an
  option that insists the file exists (click's ``Path(exists=True)``) checks the flag and not the
  reader's disk;
- an inline span that ends with a flag that takes a value but gives none (``stowage extender
  --pending-pods-mib`` in prose) names the flag: the flag must exist, its value is not checked;
- an inline span that is only ``stowage SUBCOMMAND``, or that and a flag it names (``stowage plan
  --preempt``), names the command: it must exist, but what a whole command line needs (``stowage
  plan`` needs something to plan) is not asked of it.

Lines that are deliberately not a valid command (an error shown on purpose, a diagram that starts
with a command's name) are listed in :data:`NOT_COMMANDS`, each with its reason.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import runpy
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from shared_paths import ROOT

MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML = sorted((ROOT / "scheduler-config").rglob("*.yaml"))

# python -m MODULE (or the script) -> "module:function" building the parser that its main() parses with.
ARGPARSE_PARSERS: dict[str, str] = {
    "benchmarks.binpack": "benchmarks.binpack.cli:build_parser",
    "benchmarks.binpack.real": "benchmarks.binpack.real:build_parser",
    "benchmarks.binpack.bound": "benchmarks.binpack.bound:build_parser",
    "benchmarks.binpack.anatomy": "benchmarks.binpack.anatomy:build_parser",
    "benchmarks.latency": "benchmarks.latency.cli:build_parser",
    "benchmarks.latency.inproc": "benchmarks.latency.inproc:build_parser",
    "benchmarks.elastic": "benchmarks.elastic.cli:build_parser",
    "tests/fuzzing.py": "fuzzing:build_parser",
}

# Placeholder -> the value it stands for in the check (one valid value of its kind).
PLACEHOLDERS: dict[str, str] = {
    "FILE": str(Path(__file__)),       # any file: cluster files, profiles, kubeconfigs
    "DIR": str(ROOT),                  # any folder
    "DIR2": str(ROOT),                 # a second folder in the same line
    "N": "1",                          # a count, a priority
    "SHAPE": "1x80Gi",                 # a pod shape of `stowage plan`
    "T": "default",                    # a trace name of the benchmarks
}

# (file, command as quoted) -> why it is not a valid command line on purpose.
NOT_COMMANDS: dict[tuple[str, str], str] = {
    ("docs/latency.md", "stowage extender --workers 2 gunicorn master (signals, worker restarts)"):
        "the first line of a process-tree diagram: the command, then what the process is",
}

SHELL_OPERATOR = re.compile(r"^[()<>;|&]+$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^\s*```")
# A code span: single backticks; it may continue on the next lines of its paragraph, never past a blank line.
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
# In a fenced line's comment: an alternative command ("make demo   # or: stowage demo --pods 150").
ALTERNATIVE = re.compile(r"#.*?\bor: (.+)$")
# In a YAML comment, outside code spans: `stowage SUBCOMMAND --flag ...` up to the sentence's next ) , or ;
BARE_STOWAGE = re.compile(r"(?<![\w/.-])stowage [a-z-]+ --[^),;`]*")
YAML_COMMENT = re.compile(r"(?:^|\s)#(.*)$")


@dataclass(frozen=True)
class Quoted:
    """A command line as a doc quotes it."""
    where: str    # "docs/binpack.md:305", for messages
    file: str     # "docs/binpack.md", for NOT_COMMANDS
    text: str     # as written, continuation lines joined, whitespace runs made one space
    inline: bool  # a span inside prose (may name a flag without its value) rather than a code line


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def markdown_quotes(path: Path) -> list[Quoted]:
    """The lines of fenced code blocks and the inline code spans of one markdown file."""
    rel, out, prose = _rel(path), [], []
    in_fence, pending, start = False, "", 0
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence, pending = not in_fence, ""
            prose.append("")
            continue
        if not in_fence:
            prose.append(line)
            continue
        prose.append("")   # fenced lines are blanked in the prose, so spans keep their line numbers
        if not pending:
            start = no
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        out.append(Quoted(f"{rel}:{start}", rel, " ".join(text.split()), inline=False))
        if alt := ALTERNATIVE.search(text):
            out.append(Quoted(f"{rel}:{start}", rel, " ".join(alt.group(1).split()), inline=False))
    text = "\n".join(prose)
    for m in SPAN.finditer(text):
        no = text.count("\n", 0, m.start()) + 1
        out.append(Quoted(f"{rel}:{no}", rel, " ".join(m.group(1).split()), inline=True))
    return out


def yaml_quotes(path: Path) -> list[Quoted]:
    """Commands in the comments of one YAML file: code spans, and bare ``stowage SUB ...`` text."""
    rel, out = _rel(path), []
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = YAML_COMMENT.search(line)
        if not m:
            continue
        comment = m.group(1)
        for span in SPAN.finditer(comment):
            out.append(Quoted(f"{rel}:{no}", rel, " ".join(span.group(1).split()), inline=True))
        for bare in BARE_STOWAGE.finditer(SPAN.sub("", comment)):
            out.append(Quoted(f"{rel}:{no}", rel, " ".join(bare.group(0).split()), inline=True))
    return out


@dataclass(frozen=True)
class Command:
    """A quoted line that is one of our commands: which parser, and the words it gets."""
    program: str          # "stowage", "make", or a key of ARGPARSE_PARSERS
    args: list[str]


def command_of(text: str) -> Command | None:
    """The command a quoted line runs, or None when it is not one of ours (prose, output, pytest)."""
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words = list(lex)
    except ValueError:      # an unbalanced quote: prose, not a command
        return None
    for i, w in enumerate(words):
        if SHELL_OPERATOR.match(w):
            words = words[:i]
            break
    while words and (words[0] in ("$", "sudo", "time") or ENV_ASSIGNMENT.match(words[0])):
        words = words[1:]
    if not words:
        return None
    head, rest = words[0], words[1:]
    if head == "stowage" or head.endswith("/stowage"):
        return Command("stowage", rest) if rest else None
    if head == "make":
        return Command("make", rest) if rest else None
    if head.endswith("tests/fuzzing.py"):
        return Command("tests/fuzzing.py", rest)
    if re.fullmatch(r"(.*/)?python3?", head) and rest:
        if rest[0].endswith("tests/fuzzing.py"):
            return Command("tests/fuzzing.py", rest[1:])
        if rest[0] == "-m" and len(rest) > 1 and rest[1].startswith("benchmarks"):
            return Command(rest[1], rest[2:])
    return None


def arguments(args: list[str]) -> list[str]:
    """The arguments with the docs' conventions replaced (module docstring): [optional], ...,
    PLACEHOLDERS, paths that do not exist here."""
    out = []
    for a in args:
        a = a.removeprefix("[").removesuffix("]")
        if a in ("", "..."):
            continue
        if a in PLACEHOLDERS:
            a = PLACEHOLDERS[a]
        elif re.fullmatch(r"[A-Z][A-Z_]+", a):
            raise AssertionError(f"unknown placeholder {a!r}: add it to PLACEHOLDERS with a valid value")
        elif a.startswith(("/", "~/", "./", "../")) and not Path(a).expanduser().exists():
            a = str(Path(__file__))
        out.append(a)
    return out


def check_stowage(args: list[str], inline: bool) -> None:
    """click's parsing of ``stowage ARGS``: the group's options, the subcommand, its options and values."""
    from stowage.cli import main as group
    ctx = group.make_context("stowage", list(args))
    name = args[len(args) - len(ctx.args) - 1]   # the word make_context kept back as the subcommand
    _, cmd, rest = group.resolve_command(ctx, [name, *ctx.args])
    assert cmd is not None
    if inline:
        rest = _drop_named_flag_click(cmd, ctx, rest) if rest else rest
        if not rest:
            return   # `stowage plan` or `stowage plan --preempt` in prose: names the command (and an option)
    cmd.make_context(name, rest, parent=ctx)


def _drop_named_flag_click(cmd: click.Command, ctx: click.Context, rest: list[str]) -> list[str]:
    """``stowage extender --pending-pods-mib`` in prose names the flag: check it exists, not its value."""
    last = rest[-1]
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option) and last in p.opts + p.secondary_opts and not p.is_flag:
            return rest[:-1]
    return rest


def check_argparse(program: str, args: list[str], inline: bool) -> None:
    """``parse_args`` of the parser the command builds; argparse reports a refusal as SystemExit(2)."""
    module, func = ARGPARSE_PARSERS[program].split(":")
    parser: argparse.ArgumentParser = getattr(importlib.import_module(module), func)()
    parser.allow_abbrev = False     # see the module docstring
    if inline and args:
        action = parser._option_string_actions.get(args[-1])
        if action is not None and action.nargs != 0:
            args = args[:-1]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):     # 0: --help
            raise AssertionError(err.getvalue().strip().splitlines()[-1]) from None


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, flags=re.M))


def check_make(args: list[str]) -> None:
    targets = [a for a in args if not a.startswith("-") and "=" not in a]
    missing = [t for t in targets if t not in make_targets()]
    assert not missing, f"no Makefile target {missing}"


def check(q: Quoted, cmd: Command) -> None:
    """Raise with the parser's own message when the quoted command would not parse."""
    args = arguments(cmd.args)
    if cmd.program == "stowage":
        try:
            check_stowage(args, q.inline)
        except click.exceptions.Exit as exc:     # --help, --version
            assert exc.exit_code == 0
        except click.ClickException as exc:
            raise AssertionError(exc.format_message()) from None
    elif cmd.program == "make":
        check_make(args)
    elif cmd.program in ARGPARSE_PARSERS:
        check_argparse(cmd.program, args, q.inline)
    else:
        raise AssertionError(f"no parser known for {cmd.program!r} (a module renamed or gone? add it to ARGPARSE_PARSERS)")


def quoted_commands() -> list[tuple[Quoted, Command]]:
    """Every quoted line of the docs that is one of our commands."""
    quotes = [q for f in MARKDOWN for q in markdown_quotes(f)] + [q for f in YAML for q in yaml_quotes(f)]
    return [(q, c) for q in quotes if (c := command_of(q.text)) is not None]


QUOTED = quoted_commands()


@pytest.mark.parametrize("q,cmd", QUOTED, ids=[f"{q.where} {q.text[:60]}" for q, _ in QUOTED])
def test_a_quoted_command_parses(q: Quoted, cmd: Command, capsys) -> None:
    reason = NOT_COMMANDS.get((q.file, q.text))
    if reason is not None:
        with pytest.raises(AssertionError):
            check(q, cmd)   # still refused: else the entry is stale and should go
        return
    try:
        check(q, cmd)
    except AssertionError as exc:
        pytest.fail(f"{q.where}: `{q.text}` does not parse: {exc}")


# --- The check itself: it refuses what the command would refuse, and finds what the docs quote.

@pytest.mark.parametrize("text,message", [
    ("stowage plan --simulated --fil 60", "No such option '--fil'"),                  # a misspelt flag
    ("stowage inspekt --simulated", "No such command 'inspekt'"),                     # a misspelt subcommand
    ("stowage extender --workers 0", "--workers"),                                    # a value out of range
    ("stowage extender --filter-keeps all", "--filter-keeps"),                        # not one of the choices
    ("stowage plan --preempt", "--preempt"),                                          # a code line needs the value
    ("stowage plan --simulated --shape 1x80Gb", "--shape"),                            # not a shape
    ("python -m benchmarks.binpack --polices stowage", "unrecognized arguments: --polices"),
    ("python -m benchmarks.binpack --seed 3", "unrecognized arguments: --seed"),     # an abbreviation of --seeds
    ("python -m benchmarks.binpack.real --jobs 0", "argument --jobs"),
    ("python -m benchmarks.elastic --peak zero", "argument --peak"),
    ("python -m benchmarks.nosuch --quick", "no parser known"),                       # a module renamed or gone
    (".venv/bin/python tests/fuzzing.py --per-verbs 10", "unrecognized arguments: --per-verbs"),
    ("make bench-binpak", "no Makefile target"),
    ("stowage plan --shape SIZE", "unknown placeholder 'SIZE'"),
])
def test_the_check_refuses_what_the_command_refuses(text: str, message: str) -> None:
    assert_refused(text, message)


def assert_refused(text: str, message: str) -> None:
    """The check of ``text`` as a code line fails with ``message`` (the parser's own)."""
    cmd = command_of(text)
    assert cmd is not None
    with pytest.raises(AssertionError) as exc:
        check(Quoted("test", "test", text, inline=False), cmd)
    assert message in str(exc.value)



# What each command used to check only after parsing (so a doc line with such a value passed the
# check above): each is now refused by the parser itself, with the command's own message.
@pytest.mark.parametrize("text,message", [
    ("python -m benchmarks.latency --workers 0", "argument --workers"),
    ("python -m benchmarks.latency --workers 1,two", "argument --workers"),
    ("python -m benchmarks.binpack.bound --seeds 0", "argument --seeds"),
    ("python -m benchmarks.binpack.bound --lp --policy nosuch", "argument --policy"),
    ("python -m benchmarks.binpack.real --no-replay", "--no-replay leaves only the burst"),
    ("python -m benchmarks.binpack.real --quick --no-replay --burst 0", "--no-replay leaves only the burst"),
    ("python -m benchmarks.binpack.real --modes stowage,fast", "argument --modes"),
    ("python -m benchmarks.binpack --policies stowage,nosuch", "argument --policies"),
    ("python -m benchmarks.elastic --days 0", "argument --days"),
    ("python -m benchmarks.elastic --step 0", "argument --step"),
    ("python -m benchmarks.elastic --deployments 0", "argument --deployments"),
    ("python -m benchmarks.elastic --peak -1", "argument --peak"),
    ("python -m benchmarks.elastic --node-stride 0", "argument --node-stride"),
    ("python -m benchmarks.elastic --target 0", "argument --target"),
    ("python -m benchmarks.elastic --jobs 0", "argument --jobs"),
    ("python -m benchmarks.elastic --seeds 42,x", "argument --seeds"),
    ("python -m benchmarks.elastic --policies nosuch", "argument --policies"),
    ("python -m benchmarks.elastic --restart-lose-past", "--restart-lose-past needs --restart-at"),
    ("python -m benchmarks.elastic --quick --restart-at 5", "--restart-at must lie inside the window"),
    ("python -m benchmarks.elastic --days 2 --restart-at 0", "--restart-at must lie inside the window"),
    (".venv/bin/python tests/fuzzing.py --per-verb 0", "argument --per-verb"),
    (".venv/bin/python tests/fuzzing.py --workers 0", "argument --workers"),
    ("stowage plan --simulated --preempt 10Gi", "--preempt needs --priority"),
    ("stowage plan --simulated", "nothing to plan"),
    ("stowage plan --simulated --shape 1 --any-model", "--any-model only applies to --drain"),
    ("stowage plan --simulated --shape 1 --max-nodes 2", "--max-nodes only applies to --drain"),
    ("stowage plan --simulated --shape 1 --placer nosuch", "unknown placement policy 'nosuch'"),
    ("stowage inspect --fill 5", "--fill only applies to --simulated"),
    ("stowage inspect --simulated --kubeconfig FILE", "cannot be combined"),
    ("stowage plan --in-cluster --context x --drain", "are exclusive"),
    ("stowage inspect --simulated --scheduler-name x", "--scheduler-name describes a live cluster's extender"),
    ("stowage inspect --simulated --record-key-file FILE", "--record-key-file describes a live cluster's extender"),
    ("stowage plan --simulated --drain --learned-configmap off", "--learned-configmap describes a live cluster's"),
    ("stowage inspect --simulated --scheduler-name x --record-key-file FILE",
     "--scheduler-name and --record-key-file describe a live cluster's extender"),
    ("stowage inspect --simulated --seed 3", "--seed only applies with --fill"),
    ("stowage inspect --learned-configmap Bad_Name", "--learned-configmap"),
    ("stowage inspect --simulated --learned", "--learned reads a live cluster"),
    ("python -m benchmarks.binpack.anatomy --policy nosuch", "argument --policy"),
    ("python -m benchmarks.binpack.anatomy --arrived 0", "argument --arrived"),
    ("python -m benchmarks.binpack.anatomy --top 0", "argument --top"),
    ("python -m benchmarks.latency.inproc --modes service,nosuch", "argument --modes"),
    ("python -m benchmarks.latency.inproc --nodes 0", "argument --nodes"),
    ("python -m benchmarks.latency.inproc --pods 0", "argument --pods"),
    ("stowage extender", "choose one model source"),
    ("stowage extender --simulated builtin --in-cluster", "choose one model source"),
    ("stowage extender --kubeconfig FILE --in-cluster", "are exclusive"),
    ("stowage extender --simulated builtin --stale-after 30", "--stale-after is for kube mode"),
    ("stowage extender --simulated builtin --record-key-file FILE", "--record-key-file is for kube mode"),
    ("stowage extender --in-cluster --bind 0.0.0.0:8888", "can be reached from other machines"),
    ("stowage extender --in-cluster --tls-cert FILE", "--tls-cert also needs --tls-client-ca, --tls-key"),
    ("stowage extender --in-cluster --learned-configmap Bad_Name", "--learned-configmap"),
])
def test_a_check_of_the_command_line_alone_is_made_while_parsing(text: str, message: str) -> None:
    assert_refused(text, message)


def test_a_flag_named_in_prose_must_exist_but_needs_no_value() -> None:
    named = Quoted("test", "test", "stowage extender --pending-pods-mib", inline=True)
    check(named, command_of(named.text))
    misspelt = Quoted("test", "test", "stowage extender --pending-pod-mib", inline=True)
    with pytest.raises(AssertionError, match="No such option"):
        check(misspelt, command_of(misspelt.text))
    with pytest.raises(AssertionError, match="unrecognized arguments: --until-pct"):
        text = "python -m benchmarks.binpack.real --until-pct"
        check(Quoted("test", "test", text, inline=True), command_of(text))


@pytest.mark.parametrize("text", ["the `stowage` policy", "`python -m pytest -q`", "`kubectl get pods`",
                                  "`stowage-scheduler`", "`make` and Python"])
def test_what_is_not_one_of_our_commands_is_left_alone(tmp_path: Path, text: str) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(text + "\n")
    assert [q for q in markdown_quotes(doc) if command_of(q.text)] == []


def test_the_extractor_finds_commands_as_the_docs_write_them(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `python -m benchmarks.binpack --trace default\n--seeds 3` first.\n\n"
        "  ```sh\n"
        "  $ CI=true stowage plan --simulated \\\n"
        "      --fill 60   # or: stowage inspect --simulated\n"
        "  output line\n"
        "  ```\n")
    got = [(q.where, q.text, q.inline) for q in markdown_quotes(doc)]
    assert got == [
        ("x.md:5", "$ CI=true stowage plan --simulated --fill 60 # or: stowage inspect --simulated", False),
        ("x.md:5", "stowage inspect --simulated", False),
        ("x.md:7", "output line", False),
        ("x.md:1", "python -m benchmarks.binpack --trace default --seeds 3", True),
    ]
    assert command_of(got[0][1]) == Command("stowage", ["plan", "--simulated", "--fill", "60"])
    yaml = tmp_path / "x.yaml"
    yaml.write_text("# listens on loopback (stowage extender --bind 127.0.0.1:8888), so: `make demo`\n"
                    "bind: x  # stowage extender --workers 2; more\n"
                    "# stowage extender in kube mode reads it\n")
    assert [q.text for q in yaml_quotes(yaml)] == [
        "make demo", "stowage extender --bind 127.0.0.1:8888", "stowage extender --workers 2"]


@pytest.mark.parametrize("program", sorted(ARGPARSE_PARSERS))
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")   # this test imported it first
def test_each_checked_parser_is_the_one_its_command_uses(program: str, monkeypatch, capsys) -> None:
    """``--help`` of the command, run as the docs run it (``python -m X`` / the script), prints
    exactly the help of the parser this test checks against: the two cannot drift apart."""
    script = program if program.endswith(".py") else None
    monkeypatch.setattr("sys.argv", [str(ROOT / script) if script else program, "--help"])
    with pytest.raises(SystemExit) as exc:
        if script:
            runpy.run_path(str(ROOT / script), run_name="__main__")
        else:
            runpy.run_module(program, run_name="__main__", alter_sys=True)
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    module, func = ARGPARSE_PARSERS[program].split(":")
    assert printed == getattr(importlib.import_module(module), func)().format_help()


def test_the_docs_quote_commands_of_every_kind() -> None:
    """A broken extractor that found nothing would pass every check above."""
    programs = {cmd.program for _, cmd in QUOTED}
    assert {"stowage", "make", "tests/fuzzing.py", *[p for p in ARGPARSE_PARSERS]} <= programs
    assert len(QUOTED) > 100


# --- Links and named paths -------------------------------------------------------------------------
# Why here: the same readers copy a path or follow a link from the same docs; a heading reworded
# (``Round 5: ... (`stowage extender --in-cluster --workers N`)``) silently breaks every
# ``#anchor`` to it, and a moved module leaves its old path in prose.

# A markdown link whose target is ours: ``[text](file.md#anchor)``, ``[text](#anchor)``, ``(img/x.png)``.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A code span that names a repository path: a top-level folder of the repository, then more.
NAMED_PATH = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*$")

# Folders the commands write into (git-ignored): a path there exists only after a run.
GENERATED = ("results/",)

# (file, path as named) -> why a path that does not exist is named on purpose.
HISTORICAL_PATHS: dict[tuple[str, str], str] = {
    ("docs/latency.md", "extender/scoring.py"): "where a speed-up was made at the time; the doc says where it is now",
    ("docs/latency.md", "extender/policies/"): "where a speed-up was made at the time; the doc says where it is now",
}


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: links reduced to their text, lower case, everything but
    letters, digits, ``_``, ``-`` and spaces dropped (backticks, dots, colons, parentheses), spaces
    made ``-``. Repeated headings get ``-1``, ``-2`` from :func:`anchors_of`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every anchor of a markdown file's headings (fenced code is not a heading)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            anchor = github_anchor(m.group(2))
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            out.add(anchor if n == 0 else f"{anchor}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Each relative link of one markdown file whose file or heading anchor does not exist."""
    text, bad = path.read_text(encoding="utf-8"), []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):   # http:, https:, mailto:: not ours to check offline
            continue
        file, _, anchor = target.partition("#")
        where = f"{_rel(path)}:{text.count(chr(10), 0, m.start()) + 1}: {target}"
        dest = (path.parent / file) if file else path
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            bad.append(f"{where} (no such heading)")
    return bad


def missing_named_paths(path: Path) -> list[str]:
    """Each code span that names a path under a top-level folder of the repository
    (``benchmarks/binpack/variants.py``, ``deploy/``) and does not exist."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir()}
    text, bad = path.read_text(encoding="utf-8"), []
    for m in SPAN.finditer(text):
        span = m.group(1).strip()
        if not NAMED_PATH.match(span) or span.split("/")[0] not in tops or "..." in span:
            continue
        if span.startswith(GENERATED):   # what a command writes, not what the repository holds
            continue
        if (ROOT / span).exists() or (_rel(path), span) in HISTORICAL_PATHS:
            continue
        bad.append(f"{_rel(path)}:{text.count(chr(10), 0, m.start()) + 1}: {span}")
    return bad


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_each_link_of_the_docs_reaches_its_file_and_heading(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_each_repository_path_the_docs_name_exists(path: Path) -> None:
    assert missing_named_paths(path) == []


def test_the_link_and_path_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks above pass on a doc with nothing to check too; this one shows they can fail,
    with GitHub's anchor rules (backticks and dots dropped, ``--`` kept, repeats numbered)."""
    (tmp_path / "other.md").write_text(
        "# Round 5: the split (`stowage extender --in-cluster --workers N`)\n## Notes\n## Notes\n"
        "```\n# not a heading\n```\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#round-5-the-split-stowage-extender---in-cluster---workers-n) "
        "[ok](other.md#notes-1) [ok](#top) [web](https://example.com/x#y)\n"
        "[stale](other.md#round-5-the-split-stowage-extender---workers-n) [gone](nope.md) "
        "[fence](other.md#not-a-heading)\n# Top\n"
        "`benchmarks/binpack/variants.py` `benchmarks/no_such.py` `a/b` `tests/...`\n", encoding="utf-8")
    assert [b.split(": ", 1)[1] for b in broken_links(doc)] == [
        "other.md#round-5-the-split-stowage-extender---workers-n (no such heading)",
        "nope.md (no such file)",
        "other.md#not-a-heading (no such heading)",
    ]
    assert [b.split(": ", 1)[1] for b in missing_named_paths(doc)] == ["benchmarks/no_such.py"]
