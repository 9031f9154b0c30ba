# replbox warm pool: python. This interpreter was started ahead of time. It waits on stdin for one
# request, then runs the program the way `python3 -u main.py ARGS` would have.
def __rbx_pool():
    import os, sys
    def take(n):
        data = b""
        while len(data) < n:
            chunk = os.read(0, n - len(data))
            if not chunk:
                os._exit(0)  # the pool let this one go unused
            data += chunk
        return data
    # What start-up allocated is kept for good: moved out of the collector's generations, so
    # the collections of the program and of the interpreter's exit do not walk it again
    # (with pyenv's python, whose start-up imports ~100 modules, that halves a pooled run).
    loaded = "gc" in sys.modules
    gc = __import__("gc")
    if not loaded:
        del sys.modules["gc"]
    gc.collect()
    gc.freeze()
    del gc, loaded
    # The CPU limit is the run's, set below; the interpreter started with the largest.
    loaded = "resource" in sys.modules
    resource = __import__("resource")
    if not loaded:
        del sys.modules["resource"]
    setrlimit, RLIMIT_CPU = resource.setrlimit, resource.RLIMIT_CPU
    del resource, loaded
    head = b""
    while not head.endswith(b"\n"):
        head += take(1)
    fields = take(int(head)).decode("utf-8", "surrogateescape").split("\0")
    file, cpu, k, m = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    argv, env = fields[5:5 + m], fields[5 + m:]
    # As the helper sets it for a cold run: SIGXCPU at the limit, SIGKILL a second later.
    setrlimit(RLIMIT_CPU, (cpu, cpu + 1))
    # The run's environment, with the same variables in the same order. The sandbox may set
    # PWD as it starts a process (bwrap does, replacing or appending it): do the same.
    pwd = os.environ.get("PWD")
    os.environ.clear()
    os.environ.update(kv.partition("=")[::2] for kv in env)
    if pwd is not None:
        os.environ["PWD"] = pwd
    path = os.path.join(os.getcwd(), file)
    sys.argv = argv[m - k - 1:]
    sys.orig_argv = argv
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    # Directories may have changed since start-up (a package installed): forget their listings.
    [f.invalidate_caches() for f in sys.meta_path if hasattr(f, "invalidate_caches")]
    # A new __main__: the one start-up made is frozen with the rest, and what the program
    # keeps in its globals must be torn down at exit as in a cold start.
    main = type(sys)("__main__")
    g = main.__dict__
    mine = (sys._getframe(0).f_code, sys._getframe(1).f_code)
    g.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path),
        __spec__=None,
        __annotations__={},
        __builtins__=sys.modules["builtins"],
        __file__=path,
        __cached__=None,
    )
    sys.modules["__main__"] = main
    del head, fields, env, k, m, argv, cpu, setrlimit, RLIMIT_CPU, pwd
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        del f
        exec(code, g)
    except SystemExit:
        raise
    except BaseException:
        # Report it as the interpreter would, without this loader's frames.
        hook = sys.excepthook
        def report(t, v, tb):
            sys.excepthook = hook
            while tb is not None and tb.tb_frame.f_code in mine:
                tb = tb.tb_next
            if isinstance(v, BaseException):
                v.__traceback__ = tb
            hook(t, v, tb)
        sys.excepthook = report
        raise
__rbx_pool()
