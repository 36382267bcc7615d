#!/usr/bin/env python3
"""The docs against the tree they describe (meson suite `docs`; cheap: no VM, no root).

Usage: docs_test.py SOURCE_ROOT NESHOST

Fails, naming the doc and what it says, when
  - README's "Layout" table misses a top-level folder of the tree or a folder under host/;
  - a doc (README, docs/*.md) attributes a file to the state dir (`STATE/VM/NAME`) that
    host/lib/state_dir.hpp does not define (a string literal "NAME", or `NAME` in its comments
    for a name with a placeholder such as virtiofsd-TAG.log); ELSEWHERE lists the ones defined
    in another file today, each checked there;
  - README names a `neshost run` flag that `NESHOST run --help` does not list;
  - a doc (README, docs/*.md, examples/**/*.md) links a relative file that does not exist.
Each check prints what it read, so a failure says which rule and which text.
"""
import os
import re
import subprocess
import sys

# State-dir names the docs attribute to STATE/VM/ that are defined outside host/lib/state_dir.hpp
# today: name -> (file, the literal that defines it there). Each is checked in its file; moving
# one into state_dir.hpp makes its entry here an error (stale), so the list only shrinks.
ELSEWHERE = {
    "vmm.json": ("host/monitor/vmm_record.hpp", '"vmm.json"'),
    "workload.log.pos": ("host/lib/host.cpp", '".pos"'),
}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def tracked_files(root):
    """The tree's files (git's list when it is a checkout, else a walk without build output)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
        files = [p for p in out.decode().split("\0") if p]
        if files:
            return [p for p in files if os.path.exists(os.path.join(root, p))]
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", ".cache", "node_modules"}
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in skip and not x.startswith("build")]
        files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return files


def section(text, title):
    """The body of the markdown section `## TITLE` (up to the next `## `), or ''."""
    m = re.search(r"^## " + re.escape(title) + r"\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def check_layout(root, readme, files):
    body = section(readme, "Layout")
    if not body:
        fail("README.md: no '## Layout' section")
        return
    rows = re.findall(r"^\|\s*`([^`]+)`\s*\|", body, re.M)
    listed = {r.rstrip("/") for r in rows}
    tops = sorted({p.split("/")[0] for p in files if "/" in p})
    hosts = sorted({"host/" + p.split("/")[1] for p in files if p.startswith("host/") and p.count("/") >= 2})
    print(f"layout: {len(rows)} rows; folders {tops}; host/ {hosts}")
    for t in tops:
        if t == "node_modules":
            continue
        if t not in listed and not any(x.startswith(t + "/") for x in listed):
            fail(f"README.md Layout: top-level folder {t}/ has no row")
    for h in hosts:
        if h not in listed:
            fail(f"README.md Layout: {h}/ has no row")
    for r in sorted(listed):
        if not os.path.isdir(os.path.join(root, r)):
            fail(f"README.md Layout: row `{r}/` names no folder of the tree")


def check_state_names(root, docs):
    hpp = read(root, "host/lib/state_dir.hpp")
    literals = set(re.findall(r'"([^"\n]*)"', hpp))
    ticked = set(re.findall(r"`([^`\n]+)`", hpp))
    seen = {}
    for rel, text in docs.items():
        for m in re.finditer(r"STATE/VM/([A-Za-z0-9_.<>-]+)", text):
            name = m.group(1).rstrip(".")
            seen.setdefault(name, rel)
    print(f"state dir: the docs name {sorted(seen)}")
    for name, rel in sorted(seen.items()):
        defined = name in literals or (re.search(r"[A-Z]{2,}", name) and name in ticked)
        if name in ELSEWHERE:
            where, lit = ELSEWHERE[name]
            if defined:
                fail(f"tests/docs ELSEWHERE: {name} is in host/lib/state_dir.hpp now; drop its entry")
            elif lit not in read(root, where):
                fail(f"{rel}: STATE/VM/{name}: not in host/lib/state_dir.hpp, and {where} has no {lit}")
            continue
        if not defined:
            fail(f"{rel}: STATE/VM/{name} is not a name host/lib/state_dir.hpp defines")


FLAG = re.compile(r"(?<![\w/.-])(--?[A-Za-z][A-Za-z0-9-]*)")


def run_help_flags(neshost):
    p = subprocess.run([neshost, "run", "--help"], capture_output=True, text=True, timeout=30)
    text = p.stdout + p.stderr
    flags = set()
    for line in text.splitlines():
        if re.match(r"^ {2,}-", line):
            opt = re.split(r"\s{2,}", line.strip())[0]
            flags.update(FLAG.findall(opt))
    return flags


def readme_run_flags(readme):
    """(flag, context) for each flag README gives `neshost run`: those after `neshost run` in a
    code line or inline span (up to a lone `--`), and inline spans that are a flag alone
    (`--accel auto`), except meson's -D options."""
    out = []
    lines = []
    in_code = False
    for line in readme.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.startswith("    "):
            lines.append(line.strip())
    spans = re.findall(r"`([^`\n]+)`", readme)
    for s in spans + lines:
        if "neshost run" in s:
            rest = s.split("neshost run", 1)[1]
            rest = re.split(r"(?:^|\s)--(?:\s|$)", rest, maxsplit=1)[0]
            rest = rest.split("#", 1)[0]
            for tok in rest.split():
                tok = tok.strip("[]")
                if tok.startswith("-"):
                    out += [(f, s) for f in FLAG.findall(tok.split("=", 1)[0])[:1]]
    for s in spans:
        if s.startswith("-") and not s.startswith("-D") and "neshost run" not in s:
            out += [(f, s) for f in FLAG.findall(s.split()[0])[:1]]
    return out


def check_run_flags(readme, neshost):
    have = run_help_flags(neshost) | {"--help"}  # the help itself (its text says so in prose)
    named = readme_run_flags(readme)
    print(f"run flags: --help lists {len(have)}; README names {sorted({f for f, _ in named})}")
    if len(have) < 10:
        fail(f"`neshost run --help` lists only {sorted(have)}: not the help text expected")
    for f, ctx in named:
        if f not in have:
            fail(f"README.md: `neshost run` flag {f} (in `{ctx}`) is not in `neshost run --help`")


def check_links(root, docs):
    n = 0
    for rel, text in docs.items():
        base = os.path.dirname(rel)
        # [text](target) and [text](target "title"); code spans and blocks are not links.
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        body = re.sub(r"`[^`\n]*`", "", body)
        for m in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", body):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            n += 1
            full = os.path.normpath(os.path.join(root, base, path))
            if not full.startswith(os.path.normpath(root) + os.sep) and full != os.path.normpath(root):
                fail(f"{rel}: link ({target}) leaves the repository")
            elif not os.path.exists(full):
                fail(f"{rel}: link ({target}) names no file")
    print(f"links: {n} relative links checked")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, neshost = os.path.abspath(sys.argv[1]), sys.argv[2]
    files = tracked_files(root)
    readme = read(root, "README.md")
    docs = {"README.md": readme}
    for p in sorted(files):
        if (p.startswith("docs/") and p.endswith(".md") and p.count("/") == 1) or \
           (p.startswith("examples/") and p.endswith(".md")):
            docs[p] = read(root, p)
    check_layout(root, readme, files)
    check_state_names(root, {k: v for k, v in docs.items() if not k.startswith("examples/")})
    check_run_flags(readme, neshost)
    check_links(root, docs)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
