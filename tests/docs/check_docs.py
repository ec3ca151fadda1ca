"""The docs against the tree and the program: every relative link of README.md and docs/*.md
names a file that exists (and, with #anchor, a heading of it, slugged as GitHub does), and every
flag that a `seqpar SUBCOMMAND` command line in a code block passes is one that subcommand's
--help lists.

usage: check_docs.py REPO_ROOT path/to/seqpar
"""
import glob
import os
import re
import subprocess
import sys

root, seqpar = sys.argv[1], sys.argv[2]
docs = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
problems = []


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    seen, out, fence = {}, set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here (no network)
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        line = text.count("\n", 0, m.start()) + 1
        name = f"{os.path.relpath(doc, root)}:{line}"
        if not os.path.exists(where):
            problems.append(f"{name}: link '{target}': no file {os.path.relpath(where, root)}")
        elif anchor and where.endswith(".md") and anchor not in anchors(where):
            problems.append(f"{name}: link '{target}': no heading with anchor #{anchor}")

# Command lines in code blocks: `seqpar SUB ...` or `build/seqpar SUB ...`, joined over
# backslash continuations.
helps = {}


def flags_of(sub):
    if sub not in helps:
        r = subprocess.run([seqpar, sub, "--help"], capture_output=True, text=True)
        helps[sub] = set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout)) if r.returncode == 0 else None
    return helps[sub]


COMMAND = re.compile(r"(?:^|[\s/])seqpar\s+([a-z]+)\b(.*)")
commands = 0
for doc in docs:
    fence, joined, start = False, "", 0
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            continue
        if not joined:
            start = number
        joined += line.rstrip("\n").rstrip("\\") + " "
        if line.rstrip("\n").endswith("\\"):
            continue
        command, joined = joined, ""
        m = None if command.lstrip().startswith("#") else COMMAND.search(command)
        if not m:
            continue
        sub, rest = m.group(1), m.group(2)
        commands += 1
        known = flags_of(sub)
        name = f"{os.path.relpath(doc, root)}:{start}"
        if known is None:
            problems.append(f"{name}: 'seqpar {sub}' is not a subcommand")
            continue
        # flags after the subcommand, up to a pipe or a shell separator
        rest = re.split(r"\||;|&&|>", rest)[0]
        for flag in re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", rest):
            if flag not in known:
                problems.append(f"{name}: 'seqpar {sub} {flag}': {sub} has no such flag")

for p in problems:
    print(p)
print(f"check_docs: {len(docs)} files, {commands} command lines, {len(problems)} problems")
sys.exit(1 if problems else 0)
