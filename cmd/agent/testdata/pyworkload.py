# The Python workloads of python_e2e_test.go: python3 pyworkload.py MODE SECONDS.
#   pure     main -> outer -> middle -> inner, all Python
#   zlib     main -> outer -> compress_it -> zlib.compress: native code under a Python frame
#   threads  two threading threads, each with a chain of its own: a_outer -> a_inner and
#            b_outer -> b_inner; the main thread waits
#   init     main -> make -> K.__init__, a class instantiated from Python
#   gen      main -> consume_until -> a generator gen_outer delegating to gen_inner, and an
#            asyncio coroutine chain coro_main -> coro_outer -> coro_inner
# Each runs until SECONDS pass.
import sys
import threading
import time
import zlib

END = time.time() + float(sys.argv[2])


def inner(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def middle(n):
    return inner(n) + 1


def outer(n):
    return middle(n) + 1


DATA = bytes((i * 7919 >> 3) & 0xFF for i in range(1 << 20))


def compress_it():
    return len(zlib.compress(DATA, 9))


def outer_zlib():
    return compress_it() + 1


def a_inner(n):
    s = 0
    for i in range(n):
        s += i ^ 3
    return s


def a_outer():
    while time.time() < END:
        a_inner(200000)


def b_inner(n):
    s = 1
    for i in range(n):
        s = (s * 3 + i) & 0xFFFF
    return s


def b_outer():
    while time.time() < END:
        b_inner(200000)


def gen_inner():
    while True:
        s = 0
        for i in range(50000):
            s += i * 3
        yield s


def gen_outer():
    yield from gen_inner()


async def coro_inner():
    s = 0
    for i in range(50000):
        s += i * 5
    return s


async def coro_outer():
    return await coro_inner()


async def coro_main(until):
    import asyncio
    while time.time() < until:
        await coro_outer()
        await asyncio.sleep(0)


class K:
    def __init__(self, n):
        s = 0
        for i in range(n):
            s += i
        self.s = s


def make():
    return K(20000)


def main():
    mode = sys.argv[1]
    # Past the imports and DATA: a test that profiles many interpreters at once starts
    # sampling on this line, not on a guess of the start-up's CPU time.
    print("ready", flush=True)
    if mode == "pure":
        while time.time() < END:
            outer(200000)
    elif mode == "zlib":
        while time.time() < END:
            outer_zlib()
    elif mode == "threads":
        ts = [threading.Thread(target=a_outer), threading.Thread(target=b_outer)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    elif mode == "init":
        while time.time() < END:
            make()
    elif mode == "gen":
        import asyncio
        # A third of a second each, so any few seconds of profile see both.
        while time.time() < END:
            consume_until(time.time() + 0.3)
            asyncio.run(coro_main(time.time() + 0.3))


def consume_until(t):
    for _ in gen_outer():
        if time.time() >= t:
            return


main()
