# Prints, as JSON, what the interpreter itself reports of code objects it compiles: their
# address (id), qualified name, file, first line and the line of every bytecode range;
# then waits for its standard input to close, so that a test can read them from its memory.
import dis
import json
import sys

SOURCE = '''
def outer():
    def inner(x):
        y = x + 1
        return (y *
                2)
    return inner

class K:
    def method(self):
        for i in range(3):
            if i:
                pass
        return [j for j in range(3)]

async def coro():
    return 5

def gen():
    yield 1
    yield 2

def unicode_\u00e9():
    return "\u00fc"

def \u51fd\u6570():
    return 1

def longfn():
''' + "\n".join("    a%d = %d" % (i, i) for i in range(400)) + '''
    return (a1 +


            a2)
'''

code = compile(SOURCE, "/tmp/sond\u00e9_\U0001F600.py", "exec")
ns = {}
exec(code, ns)

objs = []


def walk(c):
    objs.append(c)
    for k in c.co_consts:
        if hasattr(k, "co_code"):
            walk(k)


walk(code)
out = []
for c in objs:
    if hasattr(c, "co_lines"):
        lines = [[s, e, -1 if l is None else l] for s, e, l in c.co_lines()]
    else:
        starts = list(dis.findlinestarts(c))
        lines = []
        for i, (off, line) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else len(c.co_code)
            lines.append([off, end, line])
        if starts and starts[0][0] > 0:
            lines.insert(0, [0, starts[0][0], c.co_firstlineno])
    table = c.co_linetable if sys.version_info >= (3, 10) else c.co_lnotab
    out.append({
        "addr": id(c),
        "name": getattr(c, "co_qualname", c.co_name),
        "file": c.co_filename,
        "first": c.co_firstlineno,
        "size": len(c.co_code),
        "table": table.hex(),
        "lines": lines,
    })
print(json.dumps(out))
sys.stdout.flush()
sys.stdin.read()
