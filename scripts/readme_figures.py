#!/usr/bin/env python3
"""Pastes the documentation's measured figures from the commands that produce them.

Every measured figure in README.md and the pages under docs/ sits in a block between

    <!-- figures ID: begin (pasted by scripts/readme_figures.py) -->
    <!-- figures ID: end -->

and this script writes the block: the command's output (the "[ figures  ]" lines of a
CTest test, or a benchmark's table) in a code fence, then one line naming the command,
the date and the machine. Nothing between the markers is written by hand.

    scripts/readme_figures.py                 # run every command, paste every block
    scripts/readme_figures.py dp_equivalence  # only these blocks
    scripts/readme_figures.py --list          # the blocks and their commands
    scripts/readme_figures.py --check         # every block is known, present once, stamped
    scripts/readme_figures.py --ctest-log LOG [IDS]  # CTest blocks from one saved `ctest -V` log

Commands run from the repository root (CTest ones in BUILD_DIR, default build, which must
hold a build with tests and benchmarks) with scripts/common.sh's environment: Open MPI's
settings and OpenBLAS's best kernels for this CPU. A command that fails leaves its block
as it was and makes the script exit non-zero. Run it on an otherwise idle machine.
"""

import datetime
import os
import platform
import re
import subprocess
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages():
    """README.md, then every page under docs/, in name order."""
    return [README] + sorted((ROOT / "docs").glob("*.md"))
BUILD_DIR = Path(os.environ.get("BUILD_DIR", ROOT / "build"))


@dataclass
class Figure:
    command: list  # argv, run from the repository root (or BUILD_DIR for ctest)
    ctest: bool = False  # keep only the "[ figures  ]" lines, once each
    env: dict = field(default_factory=dict)
    keep: str = ""  # a regex: keep only the stdout lines that match (empty: all)
    build: str = ""  # the build directory a ctest figure runs in, if not BUILD_DIR

    def build_dir(self):
        return ROOT / self.build if self.build else BUILD_DIR

    def shown(self):
        words = [f"{k}={v}" for k, v in self.env.items()] + [shlex.quote(word) for word in self.command]
        text = " ".join(words).replace(f"{ROOT}/", "")
        return f"(cd {self.build_dir().name} && {text} | grep figures)" if self.ctest else text


def ctest(name, build=""):
    return Figure(["ctest", "-R", name, "-V"], ctest=True, build=build)


MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
BIG_GPT = ["--set", "model.d_model=384", "--set", "model.n_layer=6", "--set", "model.vocab_size=4096",
           "--set", "zero.bucket_mb=4", "--set", "zero.max_live_mb=0"]

FIGURES = {
    "dp_equivalence": ctest("dp_equivalence"),
    "zero_equivalence": ctest("zero_equivalence"),
    "zero_contract": ctest("zero_contract"),
    "offload_equivalence": ctest("offload_equivalence"),
    "tp_equivalence": ctest("tp_equivalence"),
    "pp_equivalence": ctest("pp_equivalence"),
    "matrix_equivalence": ctest("matrix_equivalence"),
    "context_attention": ctest("context_attention"),
    "cp_equivalence": ctest("cp_equivalence"),
    "cp_memory": ctest("cp_memory"),
    "cp_memory_fused": ctest("cp_memory", build="build-wheel"),  # LibTorch 2.11: fused attention
    "ep_equivalence": ctest("ep_equivalence"),
    "checkpoint_reshard": ctest("checkpoint_reshard"),
    "checkpoint_export": ctest("checkpoint_export"),
    "checkpoint_faults": ctest("checkpoint_(preemption|crash|manifest_fuzz)"),
    "faults": ctest("faults_test"),
    "existing_trainers": ctest("existing_trainers"),
    "gan_equivalence": ctest("gan_equivalence"),
    "soak": Figure(["scripts/soak.sh", "2000", "200"], keep=r"^\[ figures  \] soak"),
    "bench_checkpoint": Figure(["bench/checkpoint.sh"], keep=r"^(GPT example|checkpoint|mode|sync|async)"),
    "bench_zero": Figure(["bench/zero.sh"] + BIG_GPT, env={"TORCH": "wheel"}, keep=r"^(impl/stage|parallax-|torch-|zero\d-|Parallax / PyTorch)"),
    "bench_offload_step": Figure([str(BUILD_DIR / "bench/bench_offload_step"), "--params", "50"]),
    "bench_cpu_adam": Figure([str(BUILD_DIR / "bench/bench_cpu_adam"), "--threads", "2"]),
    "bench_tp": Figure(["bench/tp.sh"], env={"TORCH": "wheel"}, keep=r"^(layout|tp\d|torch-tp|Parallax / PyTorch)"),
    "bench_pipeline": Figure(["bench/pipeline.sh"], env={"TORCH": "wheel"}, keep=r"^(schedule|1f1b|gpipe|interleaved|zb-h1)"),
    "bench_threads": Figure(["bench/threads.sh"], env={"REPEAT": "3"}, keep=r"^(setting|OMP_|\(no thread)"),
    "bench_engine_step": Figure([str(BUILD_DIR / "bench/bench_engine_step")]),
    "bench_plan_accuracy": Figure(["bench/plan_accuracy.sh"], keep=r"^(layout|np\d|median|cluster|malloc|glibc|tcmalloc)"),
    "bench_link_classes": Figure(["bench/link_classes.sh"], keep=r"^(size|\d+[KM]iB)"),
    "bench_context_attention": Figure(["bench/context_attention.sh"], env={"TORCH": "wheel"},
                                      keep=r"^(causal|method|whole|ring|all-to-all|PyTorch|torch|Parallax)"),
    "bench_moe": Figure(["bench/moe.sh"], env={"TORCH": "wheel"},
                        keep=r"^(MoE layer|layout|every expert|parallax ep|tokens per|torch|Parallax)"),
    "bench_allreduce": Figure(MPIRUN + ["-np", "4", str(BUILD_DIR / "bench/bench_allreduce"), "--nonblocking"]),
}

FOLD_LINES = 16
BLOCK = re.compile(r"<!-- figures (?P<id>[\w-]+): begin[^>]*-->\n(?P<body>.*?)<!-- figures (?P=id): end -->\n",
                   re.DOTALL)
STAMP = re.compile(r"^Pasted from `.+` on \d{4}-\d{2}-\d{2}, .+\.$", re.MULTILINE)


def machine():
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}"


def figures_of_ctest(lines, test_prefix=""):
    """The "[ figures  ]" lines of `ctest -V` output (of the CTest tests whose names start
    with `test_prefix`; each line names its GoogleTest test, tests/figures.h), once each,
    after the CTest test's rank suffix ("np2 Suite.Test: ...")."""
    names, kept, seen = {}, [], set()
    for raw in lines:
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw)
        started = re.search(r"Start +(\d+): (\S+)", line)
        if started:
            names[started.group(1)] = started.group(2)
        m = re.match(r"^(\d+): (.*)$", line)
        if not m:
            continue
        number, text = m.groups()
        at = text.find("[ figures  ] ")
        if at < 0 or not names.get(number, "").startswith(test_prefix):
            continue
        ranks = names[number].rpartition(".")[2]
        shown = f"{ranks} {text[at + len('[ figures  ] '):]}"
        if shown not in seen:  # every rank may print it
            seen.add(shown)
            kept.append(shown)
    return kept


def run(name, figure):
    cwd = figure.build_dir() if figure.ctest else ROOT
    env = dict(os.environ, **figure.env)
    print(f"# {name}: {figure.shown()}", file=sys.stderr, flush=True)
    # In the environment the project's scripts give a run: Open MPI's settings (as root,
    # in containers) and OpenBLAS's best kernels for this CPU (scripts/common.sh).
    setup = f'source "{ROOT}/scripts/common.sh" && prefer_cpu_openblas_kernels && exec "$@"'
    done = subprocess.run(["bash", "-c", setup, "figure"] + figure.command, cwd=cwd, env=env,
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: `{figure.shown()}` exited with {done.returncode}")
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in done.stdout.splitlines()]  # no colours
    if figure.ctest:
        lines = figures_of_ctest(lines)
    elif figure.keep:
        lines = [line for line in lines if re.search(figure.keep, line)]
    if not lines:
        raise RuntimeError(f"{name}: `{figure.shown()}` printed no figures")
    return paste(lines, figure.shown())


def paste(lines, shown):
    """The block's text: the lines in a code fence (folded when long), then the stamp."""
    today = datetime.date.today().isoformat()
    fence = "```\n" + "\n".join(lines) + "\n```\n"
    if len(lines) > FOLD_LINES:
        fence = f"<details><summary>{len(lines)} lines</summary>\n\n{fence}\n</details>\n\n"
    return fence + f"Pasted from `{shown}` on {today}, {machine()}.\n"


def check(texts):
    """Problems of every page's blocks; `texts` maps each page's name to its text."""
    problems = []
    found = {}  # block -> the pages it is on
    for page, text in texts.items():
        for m in BLOCK.finditer(text):
            found.setdefault(m.group("id"), []).append(page)
            if not STAMP.search(m.group("body")):
                problems.append(f"{page}: block '{m.group('id')}' has no 'Pasted from ...' line; "
                                f"run scripts/readme_figures.py {m.group('id')}")
        opened = len(re.findall(r"<!-- figures [\w-]+: begin", text))
        well_formed = len(list(BLOCK.finditer(text)))
        if opened != well_formed:
            problems.append(f"{page}: {opened} blocks begin, {well_formed} are well formed")
    for name, where in found.items():
        if name not in FIGURES:
            problems.append(f"{where[0]}: block '{name}' has no command in scripts/readme_figures.py")
        elif len(where) > 1:
            problems.append(f"block '{name}' appears {len(where)} times ({', '.join(where)})")
    for name in FIGURES:
        if name not in found:
            problems.append(f"no page has a block for '{name}' (scripts/readme_figures.py lists it)")
    return problems


def main(argv):
    texts = {str(page.relative_to(ROOT)): page.read_text() for page in pages()}
    if argv[:1] == ["--check"]:
        problems = check(texts)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if argv[:1] == ["--list"]:
        for name, figure in FIGURES.items():
            print(f"{name}\t{figure.shown()}")
        return 0
    ctest_log = None
    if argv[:1] == ["--ctest-log"] and len(argv) >= 2:
        ctest_log = Path(argv[1]).read_text(errors="replace").splitlines()
        argv = argv[2:] or [n for n, f in FIGURES.items() if f.ctest]
    names = argv or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"unknown block(s): {', '.join(unknown)}; known: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        try:
            figure = FIGURES[name]
            if ctest_log is not None and figure.ctest:
                body = paste(figures_of_ctest(ctest_log, test_prefix=name),
                             f"(cd {BUILD_DIR.name} && ctest -V -LE gpu | grep figures), {name}_test")
            else:
                body = run(name, figure)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            failed += 1
            continue
        pattern = re.compile(rf"(<!-- figures {name}: begin[^>]*-->\n).*?(<!-- figures {name}: end -->\n)", re.DOTALL)
        page = next((p for p, text in texts.items() if pattern.search(text)), None)
        if page is None:
            print(f"no page has a block '{name}'", file=sys.stderr)
            failed += 1
            continue
        texts[page] = pattern.sub(lambda m: m.group(1) + body + m.group(2), texts[page])
        (ROOT / page).write_text(texts[page])  # after each block: an interrupted run keeps what it measured
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
