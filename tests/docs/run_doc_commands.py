"""Runs the seqpar command lines of README.md and docs/*.md as written, in order within each
code block, shrunk where they would take minutes on a small machine (--seq, --cached, --new and
--prompt-len capped; the doc's numbers are its own), and checks each exits as the doc shows: 0,
or 2 where the block prints "seqpar: error". A command that needs a checkpoint or input file the
tree does not hold (a Hugging Face directory, in.safetensors) is skipped and counted.

usage: run_doc_commands.py REPO_ROOT path/to/seqpar [mpiexec]
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

root, seqpar = sys.argv[1], os.path.abspath(sys.argv[2])
mpiexec = sys.argv[3] if len(sys.argv) > 3 else ""
docs = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
CAPS = {"--seq": 2048, "--cached": 4096, "--new": 512, "--prompt-len": 200}
# Flags that name files (--model: for generate and denoise; elsewhere it names a preset).
FILE_FLAGS = {"--model", "--inputs", "--prompt-ids-file", "--weights", "--parallel-config"}


def commands(doc):
    """(line, command, expected exit) for the seqpar and printf lines of the doc's code blocks."""
    out, fence, joined, start, block = [], False, "", 0, []
    lines = open(doc, encoding="utf-8").read().split("\n")
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = not fence
            if not fence:
                out.extend(block)
                block = []
            continue
        if not fence:
            continue
        if not joined:
            start = number
        joined += line.rstrip("\\") + " "
        if line.endswith("\\"):
            continue
        text, joined = joined.strip(), ""
        text = re.sub(r"^\$ ", "", text)
        if re.match(r"(build/)?seqpar [a-z]+( |$)", text) \
                or re.match(r"mpirun .*build/seqpar [a-z]+( |$)", text) \
                or text.startswith("printf "):
            block.append([start, text, 0])
        elif block and text.startswith("seqpar: error"):
            block[-1][2] = 2  # the transcript shows the refusal
    return out


def shrink(argv):
    out = []
    for i, a in enumerate(argv):
        if i > 0 and argv[i - 1] in CAPS and a.isdigit():
            a = str(min(int(a), CAPS[argv[i - 1]]))
        out.append(a)
    return out


failures, ran, skipped = [], 0, 0
work = tempfile.mkdtemp(prefix="seqpar-docs-")
for doc in docs:
    name = os.path.relpath(doc, root)
    for line, text, expected in commands(doc):
        if text.startswith("printf "):
            subprocess.run(text, shell=True, cwd=work)
            continue
        argv = shlex.split(text.split(" #")[0])
        if argv[0] == "mpirun":
            if not mpiexec:
                skipped += 1
                print(f"{name}:{line}: skipped: no mpiexec")
                continue
            at = argv.index("build/seqpar")
            launcher = [mpiexec, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism",
                        "none"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            argv = launcher + argv[1:at] + [seqpar] + argv[at + 1:]
        else:
            argv[0] = seqpar
        sub = argv[argv.index(seqpar) + 1]
        files = FILE_FLAGS if sub in ("generate", "denoise") else FILE_FLAGS - {"--model"}
        missing = [argv[i + 1] for i in range(len(argv) - 1)
                   if argv[i] in files and not os.path.exists(os.path.join(work, argv[i + 1]))]
        if missing:
            skipped += 1
            print(f"{name}:{line}: skipped: no {missing[0]} here")
            continue
        argv = shrink(argv)
        r = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600)
        ran += 1
        if r.returncode != expected:
            tail = (r.stderr.strip().splitlines() or [""])[-1]
            failures.append(f"{name}:{line}: exit {r.returncode}, expected {expected}: "
                            f"{' '.join(argv[1:])}: {tail}")
for f in failures:
    print(f)
print(f"run_doc_commands: {ran} ran, {skipped} skipped (no checkpoint or launcher here), "
      f"{len(failures)} failed")
sys.exit(1 if failures else 0)
