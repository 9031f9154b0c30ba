# replbox's bootstrap for `python3 -i` (see docs/bootstrap-protocol.md). Before writing it
# into the session's control directory, replbox replaces the placeholders below: text ones,
# marked `:json`, by Python string literals; numbers by numbers.
def __rbx_setup():
    import _thread, ast, asyncio, base64, builtins, functools, inspect, json, linecache, os
    import signal, stat, sys
    import termios
    import traceback
    nonce, ctl, out, cell_file = {nonce:json}, {ctl:json}, {out:json}, {cell_file:json}
    input_file = {input_file:json}
    boot = os.path.abspath(__file__) if "__file__" in globals() else ""
    main = sys.modules["__main__"]
    g = main.__dict__
    # Look like a fresh REPL: no script name, no __file__, no history written to $HOME.
    sys.argv = [""]
    g.pop("__file__", None)
    g.pop("__cached__", None)
    try:
        import readline
        readline.set_auto_history(False)
        readline.write_history_file = lambda *a, **k: None
    except Exception:
        pass
    # The prompts are ours between cells (replbox recognises them) and the user's while a
    # cell runs: `sys.ps1 = 'In: '` is kept for the cell that reads it, never printed.
    ours = ({prompt:json}, {continuation:json})
    user_ps = [">>> ", "... "]
    sys.ps1, sys.ps2 = ours
    # Markers go to a descriptor of their own on the terminal, so code that closes or
    # redirects stdout (os.close(1)) cannot swallow them.
    tty = os.fstat(1).st_rdev

    def open_tty():
        try:
            return os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return -1

    mark = [os.dup(1)]

    def tell(text):
        try:
            st = os.fstat(mark[0])
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != tty:
                raise OSError
        except OSError:
            # Closed, or its number reused by the code for something else: leave that alone.
            mark[0] = open_tty()
        try:
            os.write(mark[0], text.encode())
        except OSError:
            pass
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    max_images = {max_images}
    user_limit = {sync_base}  # internal evaluations (resynchronisation) are numbered from here
    cell = {"n": 0, "shots": [], "omitted": 0, "force": None, "extra": {}, "displays": [],
            "displays_omitted": 0, "busy": False}
    tuned = set()

    # --- tables: pandas and numpy print for a wide terminal (the PTY has 200 columns) ---
    def tune():
        pd = sys.modules.get("pandas")
        if "pandas" not in tuned and pd is not None and hasattr(pd, "set_option"):
            try:
                pd.set_option("display.width", 200, "display.max_columns", 50,
                              "display.expand_frame_repr", False, "display.max_rows", 60,
                              "display.min_rows", 20, "display.max_colwidth", 80)
                tuned.add("pandas")
            except Exception:
                pass
        np = sys.modules.get("numpy")
        if "numpy" not in tuned and np is not None and hasattr(np, "set_printoptions"):
            try:
                np.set_printoptions(linewidth=200)
                tuned.add("numpy")
            except Exception:
                pass

    # --- figures: every figure drawn or changed by a cell comes back as a PNG ---
    def root_figure(v):
        try:
            return v.get_figure(root=True)
        except TypeError:
            return v.figure
        except Exception:
            return None

    def kept_figures():
        # Figures the code keeps: a global names the figure, one of its axes or artists, or
        # a list, tuple or array of them (fig, axs = plt.subplots(2, 2)).
        Artist = sys.modules["matplotlib.artist"].Artist
        kept = set()
        def look(v):
            if isinstance(v, Artist):
                f = root_figure(v)
                if f is not None:
                    kept.add(id(f))
                return True
            return False
        for v in list(g.values()):
            if look(v):
                continue
            if isinstance(v, (list, tuple)):
                for e in v[:64]:
                    look(e)
            elif type(v).__name__ == "ndarray" and getattr(v, "dtype", None) == object:
                for e in v.flat[:64]:
                    look(e)
        return kept

    def save(fig, num):
        if len(cell["shots"]) >= max_images:
            cell["omitted"] += 1
            fig.stale = False
            fig._rbx_changed = False
            return
        name = "img-%d-%d.png" % (cell["n"], len(cell["shots"]) + 1)
        try:
            fig.savefig(os.path.join(out, name), format="png", bbox_inches="tight")
            cell["shots"].append({"file": name, "figure": num})
        except Exception as e:
            print("[replbox: figure %s could not be drawn: %s: %s]"
                  % (num, type(e).__name__, e), file=sys.stderr)
        # savefig leaves the figure stale; clean now, any later change makes it stale again.
        fig.stale = False
        fig._rbx_changed = False

    def figures():
        plt = sys.modules.get("matplotlib.pyplot")
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        if plt is None or helpers is None:
            return
        force = cell["force"]
        cell["force"] = None
        managers = sorted(helpers.Gcf.get_all_fig_managers(), key=lambda m: m.num)
        if not managers and force is None:
            return
        kept = kept_figures()
        seen = False
        for m in managers:
            fig = m.canvas.figure
            seen = seen or fig is force
            if fig.stale or getattr(fig, "_rbx_changed", False) or fig is force:
                save(fig, m.num)
            if id(fig) not in kept:
                plt.close(fig)
        if force is not None and not seen:
            save(force, getattr(force, "number", None))

    def show(*args, **kwargs):
        # Like a notebook: what is drawn so far comes back now, in order, and figures the
        # code does not keep are closed, so the next plot starts a new figure.
        if cell["n"] and cell["n"] < user_limit:
            figures()

    def on_pyplot(module):
        module.show = show
        # In interactive mode (plt.ion()) pyplot draws a figure as soon as it changes, which
        # clears `stale`; its stale callback sees every change, so note them there too.
        auto = getattr(module, "_auto_draw_if_interactive", None)
        if callable(auto):
            def noting(fig, val):
                if val:
                    try:
                        fig._rbx_changed = True
                    except Exception:
                        pass
                return auto(fig, val)
            module._auto_draw_if_interactive = noting

    def on_matplotlib(module):
        # Each session has a font cache of its own, so its first pyplot import builds one,
        # and matplotlib says so only when that takes over 5 s (a loaded host): a line that
        # would come and go in a cell's output. Dropped before font_manager can log it.
        import logging
        logging.getLogger("matplotlib.font_manager").addFilter(
            lambda r: not str(r.msg).startswith("Matplotlib is building the font cache"))

    # --- rich display: the Jupyter display protocol without IPython. display(obj), and a
    # cell's value, with _repr_*_ methods leave a MIME bundle (JSON, as in a notebook) in
    # out/, which the end marker names; replbox returns each kind as content. The reprs are
    # user code: what they return is checked and bounded here, and again by replbox. ---
    max_displays, max_bundle = 16, 4 << 20
    reprs = (("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
             ("text/latex", "_repr_latex_"), ("image/svg+xml", "_repr_svg_"),
             ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"),
             ("application/json", "_repr_json_"))

    def real_method(obj, name):
        # As IPython does: an object whose __getattr__ answers any name has no reprs.
        try:
            if inspect.isclass(obj) or inspect.ismodule(obj):
                return None
            if getattr(obj, "_ipython_canary_method_should_not_exist_", None) is not None:
                return None
            m = getattr(obj, name, None)
        except Exception:
            return None
        return m if callable(m) else None

    def bundle_of(obj):
        data, used = {}, [0]

        def put(mime, v):
            if not isinstance(mime, str) or mime in data or mime == "text/plain" or v is None:
                return
            if isinstance(v, tuple) and len(v) == 2:
                v = v[0]  # (data, metadata)
            if isinstance(v, (bytes, bytearray)):
                v = base64.b64encode(bytes(v)).decode() if mime.startswith("image/") \
                    else bytes(v).decode("utf-8", "replace")
            if isinstance(v, str):
                size = len(v)
            elif isinstance(v, (dict, list)) and mime.endswith("json"):
                try:
                    size = len(json.dumps(v))
                except Exception:
                    return
            else:
                return
            if used[0] + size > max_bundle:
                return
            used[0] += size
            data[mime] = v

        m = real_method(obj, "_repr_mimebundle_")
        if m is not None:
            try:
                got = m(include=None, exclude=None)
                if isinstance(got, tuple) and len(got) == 2:
                    got = got[0]
                if isinstance(got, dict):
                    for mime, v in list(got.items())[:32]:
                        put(mime, v)
            except Exception:
                pass
        for mime, name in reprs:
            if mime in data:
                continue
            m = real_method(obj, name)
            if m is not None:
                try:
                    put(mime, m())
                except Exception:
                    pass
        return data

    def frame_of(obj):
        # A pandas table as data the agent reads exactly: shape, columns with dtypes, and
        # the first and last rows as records (few, bounded by replbox again).
        t = type(obj)
        if t.__module__.split(".")[0] != "pandas" or t.__name__ not in ("DataFrame", "Series"):
            return None
        try:
            df = obj.to_frame() if t.__name__ == "Series" else obj
            n, cols = len(df), df.iloc[:, :50]
            if not (type(df.index).__name__ == "RangeIndex" and df.index.name is None):
                cols = cols.reset_index()

            def records(part):
                return json.loads(part.to_json(orient="records", date_format="iso",
                                               default_handler=str))
            frame = {"type": t.__module__.split(".")[0] + "." + t.__name__,
                     "shape": list(obj.shape),
                     "columns": [{"name": str(c)[:200], "dtype": str(d)}
                                 for c, d in list(df.dtypes.items())[:50]]}
            if n <= 10:
                frame["head"] = records(cols)
            else:
                frame["head"], frame["tail"] = records(cols.head(5)), records(cols.tail(5))
            return frame
        except Exception:
            return None

    def publish(obj, text_shown):
        # The bundle of `obj` into out/ when it has more than text; False when it has not.
        data = bundle_of(obj)
        frame = frame_of(obj)
        if not data and frame is None:
            return False
        if len(cell["displays"]) >= max_displays:
            cell["displays_omitted"] += 1
            return True
        name = "disp-%d-%d.json" % (cell["n"], len(cell["displays"]) + 1)
        body = {"data": data}
        if frame is not None:
            body["frame"] = frame
        try:
            with open(os.path.join(out, name), "w", encoding="utf-8") as f:
                json.dump(body, f)
            cell["displays"].append({"file": name})
        except Exception as e:
            print("[replbox: display could not be kept: %s: %s]" % (type(e).__name__, e),
                  file=sys.stderr)
        return True

    def user_display(*objs, raw=False, **kwargs):
        # Jupyter's display(): each object's text is printed, its rich forms returned.
        for obj in objs:
            mf = sys.modules.get("matplotlib.figure")
            if mf is not None and isinstance(obj, mf.Figure):
                save(obj, getattr(obj, "number", None))
                continue
            if raw and isinstance(obj, dict):
                text = obj.get("text/plain")
                if isinstance(text, str):
                    print(text)
                holder = type("Raw", (), {"_repr_mimebundle_":
                                          lambda self, include=None, exclude=None: obj})()
                publish(holder, True)
                continue
            try:
                text = repr(obj)
            except Exception as e:
                text = "<%s: repr failed: %s>" % (type(obj).__name__, type(e).__name__)
            print(text)
            publish(obj, True)

    def on_plotly_io(module):
        # Plotly and Altair pick a browser or HTML renderer outside a notebook: in a session
        # they return their JSON (the user's own choice, made after the import, wins).
        module.renderers.default = "plotly_mimetype"

    def on_altair(module):
        module.renderers.enable("mimetype")

    def on_ipython_display(module):
        # IPython's display() prints only a repr outside its own shell: ours returns the
        # rich forms; `from IPython.display import display` then finds it.
        module.display = user_display

    # An import hook for the modules above: adjusts each right after the user's code
    # imports it (so `import pandas; print(df)` in one cell already prints wide, and user
    # settings made after the import win). Other imports only cost a dict lookup.
    watch = {"pandas": lambda m: tune(), "numpy": lambda m: tune(),
             "matplotlib": on_matplotlib, "matplotlib.pyplot": on_pyplot,
             "IPython.core.display_functions": on_ipython_display,
             "plotly.io": on_plotly_io, "altair": on_altair}

    class After:
        def __init__(self, real, then):
            self.real, self.then = real, then
        def create_module(self, spec):
            return self.real.create_module(spec)
        def exec_module(self, module):
            # Hand the module its real loader back before it runs: it should look as if
            # imported the ordinary way.
            module.__loader__ = self.real
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.real
            self.real.exec_module(module)
            try:
                self.then(module)
            except Exception:
                pass

    class Hook:
        def find_spec(self, name, path=None, target=None):
            then = watch.get(name)
            if then is None:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = After(spec.loader, then)
                    return spec
            return None

    sys.meta_path.insert(0, Hook())

    def after_cell(n):
        if n >= user_limit:
            return None
        tune()
        if "matplotlib.pyplot" in sys.modules:
            figures()
        extra = {}
        if cell["shots"]:
            extra["images"] = cell["shots"]
        if cell["omitted"]:
            extra["images_omitted"] = cell["omitted"]
        if cell["displays"]:
            extra["displays"] = cell["displays"]
        if cell["displays_omitted"]:
            extra["displays_omitted"] = cell["displays_omitted"]
        return extra or None

    def emit(n, status, err, extra=None):
        payload = ""
        body = dict(err or {})
        body.update(extra or {})
        body.update(cell["extra"])
        if body:
            payload = base64.b64encode(json.dumps(body).encode()).decode()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        tell("\x1b_rbx;%s;e;%d;%s;%s\x1b\\" % (nonce, n, status, payload))

    def discard_unread(n):
        # Input typed into this cell (replbox says so with a file) that the program did not
        # read would be the REPL's next line: read it out of the terminal, with the line
        # discipline briefly out of line mode so that a line without Enter comes too, and
        # count it. The REPL reads nothing meanwhile: this is its own process.
        if not os.path.exists(os.path.join(ctl, input_file.replace("{n}", str(n)))):
            return 0
        count, fd = 0, 0
        try:
            if not os.isatty(0):
                fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
            old = termios.tcgetattr(fd)
            now = list(old)
            now[3] &= ~termios.ICANON
            now[6] = list(old[6])
            now[6][termios.VMIN], now[6][termios.VTIME] = 0, 0
            termios.tcsetattr(fd, termios.TCSANOW, now)
            try:
                while count < 1 << 24:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    count += len(chunk)
            finally:
                termios.tcsetattr(fd, termios.TCSANOW, old)
                termios.tcflush(fd, termios.TCIFLUSH)
        except (OSError, termios.error):
            pass
        finally:
            if fd != 0:
                os.close(fd)
        return count

    def user_tb(tb):
        # From the first of the user's frames: without this file's frames, nor asyncio's
        # that ran the cell's task.
        t = tb
        while t is not None and (t.tb_frame.f_code.co_filename == boot
                                 or t.tb_frame.f_code.co_filename.startswith(aio_dir)):
            t = t.tb_next
        if t is not None:
            return t
        while tb is not None and tb.tb_frame.f_code.co_filename == boot:
            tb = tb.tb_next
        return tb

    def print_tb(e, tb):
        # As traceback.print_exception prints it, without this file's frames anywhere in
        # it (the interrupt handler's own frame ends every KeyboardInterrupt's stack); the
        # end marker says how many lines it took, so a notebook export can tell the
        # traceback from what the cell printed.
        # Within the interpreter's own bound: its last sys.tracebacklimit (1000) entries, as
        # python prints them; the whole of a deep recursion took many seconds to extract.
        limit = getattr(sys, "tracebacklimit", 1000)
        limit = limit if isinstance(limit, int) and limit >= 0 else 1000
        te = traceback.TracebackException(type(e), e, tb, limit=-limit if limit else 0)
        te.stack = traceback.StackSummary.from_list(
            [f for f in te.stack if f.filename != boot])
        text = "".join(te.format())
        sys.stderr.write(text)
        cell["extra"]["traceback_lines"] = text.count("\n")

    class Counting:
        # sys.stdout while the display hook shows the value: counts the lines it writes.
        def __init__(self, real):
            self.real, self.lines = real, 0
        def write(self, s):
            self.lines += s.count("\n")
            return self.real.write(s)
        def __getattr__(self, name):
            return getattr(self.real, name)

    def display(value):
        real = sys.stdout
        counting = Counting(real)
        sys.stdout = counting
        try:
            sys.displayhook(value)
        finally:
            if sys.stdout is counting:
                sys.stdout = real
        if counting.lines:
            cell["extra"]["value_lines"] = counting.lines

    # --- asyncio as in IPython/ipykernel: one event loop for the session, the current loop
    # in every cell. A cell with a top-level `await` runs as a task of it; a task a cell
    # creates (asyncio.create_task works in any cell) runs on while the REPL waits between
    # cells, and in the next cell that awaits. asyncio.run() in a cell still runs its own
    # loop, as in a script. ---
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    cell_task = [None]
    aio_dir = os.path.join(os.path.dirname(asyncio.__file__), "")
    main_thread = _thread.get_ident()
    real_create_task = asyncio.tasks.create_task

    @functools.wraps(real_create_task)
    def create_task(coro, **kwargs):
        # Outside a running loop (a cell without `await`), the session's loop takes it.
        if asyncio.events._get_running_loop() is None and _thread.get_ident() == main_thread:
            return session_loop().create_task(coro, **kwargs)
        return real_create_task(coro, **kwargs)

    asyncio.create_task = asyncio.tasks.create_task = create_task

    def session_loop():
        nonlocal loop
        if loop.is_closed():
            loop = asyncio.new_event_loop()
        return loop

    def run_code(body, tail):
        # The cell's statements, then the value of its last expression (None without one).
        # A cell with a top-level `await` runs whole as a task of the session's loop; one
        # without runs as in a script (asyncio.run() works, no loop is running).
        if not (body.co_flags | (0 if tail is None else tail.co_flags)) & inspect.CO_COROUTINE:
            eval(body, g)
            return None if tail is None else eval(tail, g)

        async def whole():
            r = eval(body, g)
            if body.co_flags & inspect.CO_COROUTINE:
                await r
            if tail is None:
                return None
            v = eval(tail, g)
            return (await v) if tail.co_flags & inspect.CO_COROUTINE else v

        lp = session_loop()
        task = lp.create_task(whole())
        cell_task[0] = task
        try:
            if intr["pending"]:
                # Interrupted before the task existed: it ends as it begins.
                intr.update(pending=False, cancelled=True)
                task.cancel()
            return lp.run_until_complete(task)
        except asyncio.CancelledError as e:
            if not intr["cancelled"]:
                raise
            # The interrupt that cancelled the cell, shown where the cell's code waited.
            raise KeyboardInterrupt().with_traceback(e.__traceback__) from None
        finally:
            cell_task[0] = None
            if not task.done():
                task.cancel()  # an interrupt taken in another task's code

    def idle_hook():
        # PyOS_InputHook: called while the REPL waits for its next line. Runs the session's
        # loop (its tasks, servers, timers) until the terminal has input.
        try:
            lp = loop
            if cell["busy"] or lp.is_running() or lp.is_closed():
                return 0
            lp.add_reader(0, lp.stop)
            try:
                lp.run_forever()
            finally:
                lp.remove_reader(0)
        except BaseException:
            pass
        return 0

    idle = {"hook": None, "failed": False}

    def keep_loop_running():
        # Once the loop has something to do, the REPL runs it between cells.
        if idle["hook"] is not None or idle["failed"]:
            return
        try:
            lp = loop
            if not (lp._ready or lp._scheduled or asyncio.all_tasks(lp)
                    or len(lp._selector.get_map()) > 1):
                return
        except Exception:
            pass
        try:
            import ctypes
            hook = ctypes.CFUNCTYPE(ctypes.c_int)(idle_hook)
            ctypes.c_void_p.in_dll(ctypes.pythonapi, "PyOS_InputHook").value = \
                ctypes.cast(hook, ctypes.c_void_p).value
            idle["hook"] = hook
        except Exception:
            idle["failed"] = True  # no ctypes here: tasks run while a later cell awaits

    # --- packages: what `pip install` put in the user site (pip's choice when site-packages
    # is not writable) is importable from the next cell on, without a restart: the user site,
    # made after start-up, joins sys.path the way site.py would have added it ---
    def user_site():
        try:
            import site
            us = site.getusersitepackages() if site.ENABLE_USER_SITE else None
            if us and us not in sys.path and os.path.isdir(us):
                site.addsitedir(us)
                import importlib
                importlib.invalidate_caches()
        except Exception:
            pass

    # --- interrupts: Ctrl-C stops the user's code and never this bootstrap's. In this file's
    # own frames (reading the cell, showing the value, figures, the end marker) an interrupt
    # is only noted: one that comes after the start marker stops the code as it begins; one
    # that comes once the code is over, or at the REPL's prompt, is too late for any cell and
    # changes nothing. ---
    intr = {"armed": False, "pending": False, "cancelled": False}
    # Where the interpreter's own libraries live: a frame there that this file called
    # directly (inspect, while the value's rich forms are looked up) is still this file's
    # work, and an interrupt landing in it is only noted.
    lib_dirs = tuple(sorted({os.path.join(d, "")
                             for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)
                             for d in (p, os.path.realpath(p))}))

    def in_user_code(frame):
        # Walk out from the interrupted frame to the first of this file's frames: the
        # frames between are the user's when one of them is the user's own code.
        while frame is not None:
            f = frame.f_code.co_filename
            if f == boot:
                return False
            if f.startswith("<") or not f.startswith(lib_dirs):
                return True
            frame = frame.f_back
        return False

    def on_sigint(signum, frame):
        if intr["armed"]:
            task = cell_task[0]
            if task is not None and not task.done():
                if asyncio.current_task(loop) is task and in_user_code(frame):
                    intr["armed"] = False
                    raise KeyboardInterrupt
                # The loop waits, or runs another task: the cell's task is cancelled where
                # it waits, as asyncio.run() does on Ctrl-C, and reports KeyboardInterrupt.
                intr.update(armed=False, cancelled=True)
                task.cancel()
                loop.call_soon_threadsafe(lambda: None)
                return
            if in_user_code(frame):
                intr["armed"] = False  # one KeyboardInterrupt per cell
                raise KeyboardInterrupt
        intr["pending"] = True

    signal.signal(signal.SIGINT, on_sigint)

    def reclaim_sigint():
        # A handler the cell installed stays the cell's: it is called while user code runs.
        h = signal.getsignal(signal.SIGINT)
        if h is not on_sigint:
            user_sigint[0] = h
            signal.signal(signal.SIGINT, on_sigint)

    user_sigint = [None]

    def armed(fn):
        # fn() with interrupts armed; the exception it ended with (None if it returned).
        # Never raises: a KeyboardInterrupt taken as fn returns is caught here too, and once
        # disarmed none is raised.
        try:
            intr["armed"] = True
            try:
                if intr["pending"]:
                    intr["pending"] = False
                    raise KeyboardInterrupt
                fn()
            finally:
                reclaim_sigint()
                intr["armed"] = False
        except BaseException as e:
            return e
        return None

    def run(n):
        user_site()
        name = "<cell %d>" % n
        status, err, exiting = "ok", None, False
        cell.update(n=n, shots=[], omitted=0, force=None, extra={}, displays=[],
                    displays_omitted=0)
        intr.update(armed=False, pending=False, cancelled=False)  # earlier ones were not for this cell
        cell["busy"] = True
        owner = os.getpid()
        sys.ps1, sys.ps2 = user_ps
        tell("\x1b_rbx;%s;s;%d\x1b\\" % (nonce, n))
        failure = None
        try:
            path = os.path.join(ctl, cell_file.replace("{n}", str(n)))
            with open(path, encoding="utf-8") as f:
                src = f.read()
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
            tree = ast.parse(src, name, "exec")
        except BaseException as e:
            # Not the user's frames: a syntax error shows as the REPL shows one.
            failure, tree = e.with_traceback(None), None
        if tree is not None:
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)

            def user():
                handler = user_sigint[0]
                if handler is not None and signal.getsignal(signal.SIGINT) is on_sigint:
                    signal.signal(signal.SIGINT, handler)
                body = compile(tree, name, "exec", flags=flags)
                tail = None if last is None else compile(last, name, "eval", flags=flags)
                value = run_code(body, tail)
                if tail is not None:
                    mf = sys.modules.get("matplotlib.figure")
                    if mf is not None and isinstance(value, mf.Figure):
                        cell["force"] = value  # a figure as the cell's value: show it, as notebooks do
                    tune()
                    display(value)
                    if value is not None and cell["force"] is None:
                        publish(value, True)
                    if inspect.iscoroutine(value) and \
                            inspect.getcoroutinestate(value) == inspect.CORO_CREATED:
                        # A coroutine shown, never awaited: dropped in a frame of the cell's
                        # own (its last line), so Python's warning names the cell, as for
                        # one called as a statement.
                        if builtins.__dict__.get("_") is value:
                            builtins._ = None
                        ns = {"v": value}
                        value = None
                        cell["extra"].pop("value_lines", None)  # the warning follows the value
                        exec(compile("\n" * (last.body.lineno - 1) + "del v", name, "exec"), ns)
            failure = armed(user)
        if isinstance(failure, SystemExit):
            exiting = True
        elif isinstance(failure, KeyboardInterrupt):
            status = "interrupted"
            print_tb(failure, user_tb(failure.__traceback__))
        elif failure is not None:
            e = failure
            status = "error"
            err = {"type": type(e).__name__, "message": str(e)[:2000]}
            tb = user_tb(e.__traceback__)
            if tree is not None:
                sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
            print_tb(e, tb)
        if os.getpid() != owner and not exiting:
            # A process the cell forked (os.fork()) ends with the cell (sys.exit() in it
            # ends it too): only the REPL's own process goes back to reading the terminal
            # and reports the end.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(0 if status == "ok" else 1)
        user_ps[:] = [getattr(sys, "ps1", ""), getattr(sys, "ps2", "")]
        sys.ps1, sys.ps2 = ours
        if exiting:
            raise failure
        user_site()
        extra = None
        try:
            extra = after_cell(n)
        except BaseException as e:
            print("[replbox: collecting figures failed: %s: %s]"
                  % (type(e).__name__, e), file=sys.stderr)
        unread = discard_unread(n)
        if unread:
            extra = dict(extra or {}, unread=unread)
        session_loop()
        asyncio.set_event_loop(loop)  # asyncio.run() in the cell left none current
        keep_loop_running()
        cell["busy"] = False
        emit(n, status, err, extra)

    # --- session_vars: the names the user defined, each with a short summary ---
    def summary(v):
        t = type(v)
        tname = t.__qualname__ if t.__module__ == "builtins" else \
            t.__module__.split(".")[0] + "." + t.__qualname__
        text, size = "", None
        try:
            size = sys.getsizeof(v)
        except Exception:
            pass
        try:
            if tname in ("pandas.DataFrame", "pandas.Series"):
                dtypes = v.dtypes.items() if tname == "pandas.DataFrame" else [(v.name, v.dtype)]
                cols = ", ".join("%s: %s" % (k, d) for k, d in list(dtypes)[:20])
                text = "shape %s; %s" % (tuple(v.shape), cols)
                size = int(v.memory_usage(index=True, deep=False).sum()) \
                    if tname == "pandas.DataFrame" else int(v.memory_usage(index=True, deep=False))
            elif tname == "numpy.ndarray":
                text = "shape %s; dtype %s" % (tuple(v.shape), v.dtype)
                size = int(v.nbytes)
            elif inspect.isroutine(v) or inspect.isclass(v):
                try:
                    text = v.__name__ + str(inspect.signature(v))
                except (TypeError, ValueError):
                    text = v.__name__
            else:
                import reprlib
                short = reprlib.Repr()
                short.maxstring, short.maxother, short.maxlist = 60, 60, 6
                text = short.repr(v)
                if isinstance(v, (str, bytes, list, tuple, dict, set, frozenset)):
                    text = "len %d: %s" % (len(v), text)
        except Exception as e:
            text = "(no summary: %s)" % type(e).__name__
        return tname, text[:200], size

    def list_vars():
        found, used, omitted = [], 2, 0
        # Functions and classes imported from elsewhere (`from math import sqrt`) are not
        # the user's: named apart, not listed among the data.
        main, imported, imported_used = g.get("__name__"), [], 0
        for name, v in list(g.items())[:2000]:
            if name == "_" or (name.startswith("__") and name.endswith("__")) or inspect.ismodule(v):
                continue
            if inspect.isclass(v) or inspect.isroutine(v):
                if getattr(v, "__module__", main) != main:
                    if imported_used + len(name) < 2000:
                        imported.append(name[:100])
                        imported_used += len(name) + 3
                    continue
                kind = "class" if inspect.isclass(v) else "function"
            else:
                kind = "data"
            tname, text, size = summary(v)
            entry = {"name": name[:100], "type": tname[:100], "kind": kind, "summary": text}
            if size is not None:
                entry["size"] = size
            cost = len(json.dumps(entry)) + 1
            if used + cost > 11000:
                omitted += 1
                continue
            used += cost
            found.append(entry)
        cell["extra"]["vars"] = found
        if imported:
            cell["extra"]["imported"] = imported
        if omitted:
            cell["extra"]["vars_omitted"] = omitted

    # --- session_inspect: one name looked at within a budget, printing nothing ---
    def fit(d, budget):
        # The longest field gives way (a text is cut, a list halved) until the whole fits.
        size = lambda: len(json.dumps(d, default=str)) + 20
        cut = False
        for _ in range(64):
            if size() <= budget:
                break
            cut = True
            keys = [k for k, v in d.items() if isinstance(v, (str, list)) and len(v) > 1]
            if not keys:
                break
            k = max(keys, key=lambda k: len(json.dumps(d[k], default=str)))
            v = d[k]
            d[k] = v[: len(v) // 2] if isinstance(v, list) else v[: max(1, len(v) // 2)] + "…"
        while size() > budget and len(d) > 2:
            d.popitem()
        if cut:
            d["truncated"] = True
        return d

    def records(frame):
        try:
            return json.loads(frame.to_json(orient="records", date_format="iso",
                                            default_handler=str))
        except Exception:
            return [repr(r)[:200] for r in frame.itertuples()]

    def describe(v, rows):
        tname, text, size = summary(v)
        d = {"type": tname, "summary": text}
        if size is not None:
            d["size"] = size
        if tname == "pandas.DataFrame":
            n = len(v)
            d["shape"] = list(v.shape)
            cols = []
            for c in list(v.columns)[:200]:
                s = v[c]
                col = {"name": str(c), "dtype": str(s.dtype), "nulls": int(s.isna().sum())}
                try:
                    # Distinct values counted on at most a million rows.
                    col["distinct"] = int((s if n <= 10**6 else s.sample(10**6, random_state=0)).nunique())
                except Exception:
                    pass
                cols.append(col)
            d["columns"] = cols
            d["head"] = records(v.head(rows))
            if n > rows:
                d["tail"] = records(v.tail(rows))
        elif tname == "pandas.Series":
            d["shape"] = list(v.shape)
            d["dtype"] = str(v.dtype)
            d["nulls"] = int(v.isna().sum())
            try:
                d["stats"] = json.loads(v.describe().to_json(default_handler=str))
            except Exception:
                pass
            d["head"] = records(v.head(rows).to_frame())
        elif tname == "numpy.ndarray":
            d["shape"] = list(v.shape)
            d["dtype"] = str(v.dtype)
            import math
            if v.size and v.dtype.kind in "biuf":
                import numpy, warnings
                f = v.astype("float64", copy=False)
                finite = lambda x: float(x) if math.isfinite(x) else None
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    d["stats"] = {"min": finite(numpy.nanmin(f)), "max": finite(numpy.nanmax(f)),
                                  "mean": finite(numpy.nanmean(f)), "std": finite(numpy.nanstd(f)),
                                  "nans": int(numpy.isnan(f).sum())}
            d["head"] = [x if not isinstance(x, float) or math.isfinite(x) else None
                         for x in v.ravel()[:rows * 4].tolist()] if v.dtype.kind in "biuf" \
                else [str(x)[:100] for x in v.ravel()[:rows * 4].tolist()]
        elif inspect.isroutine(v) or inspect.isclass(v):
            d["kind"] = "class" if inspect.isclass(v) else "function"
            try:
                d["signature"] = v.__name__ + str(inspect.signature(v))
            except (TypeError, ValueError):
                pass
            doc = inspect.getdoc(v)
            if doc:
                d["doc"] = doc
            try:
                d["source"] = inspect.getsource(v)
            except (OSError, TypeError):
                pass
            if inspect.isclass(v):
                d["members"] = [m for m in vars(v) if not m.startswith("__")][:100]
        else:
            import reprlib
            r = reprlib.Repr()
            r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxlevel = 2000, 500, 50, 50, 4
            d["repr"] = r.repr(v)
            if isinstance(v, (str, bytes, list, tuple, dict, set, frozenset)):
                d["len"] = len(v)
        return d

    def inspect_name(name_hex, budget):
        try:
            path = bytes.fromhex(name_hex).decode()
            head, *rest = path.split(".")
            if head not in g:
                raise NameError("name %r is not defined" % head)
            v = g[head]
            for attr in rest:
                v = getattr(v, attr)
            d = describe(v, 5)
        except Exception as e:
            d = {"error": "%s: %s" % (type(e).__name__, e)}
        cell["extra"]["inspect"] = fit(d, max(200, int(budget)))

    # --- warm sessions: modules imported before the first cell, into sys.modules only and
    # through the hook above, so they are adjusted as when the user's code imports them ---
    def preload(names):
        import importlib
        failed = []
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:
                failed.append(name)
        if failed:
            print("replbox-preload-failed: " + " ".join(failed))

    if not hasattr(builtins, "display"):
        builtins.display = user_display
    builtins.__rbx_eval = run
    builtins.__rbx_vars = list_vars
    builtins.__rbx_inspect = inspect_name
    builtins.__rbx_preload = preload

__rbx_setup()
del __rbx_setup
