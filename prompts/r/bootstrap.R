# replbox's bootstrap for R (see docs/bootstrap-protocol.md), read at start as R's user
# profile (R_PROFILE_USER), when only the base package is attached. Before writing it into
# the session's control directory, replbox replaces the placeholders below: text ones,
# marked `:json`, by string literals (a JSON string is an R string literal); numbers by
# numbers. Everything lives in one environment attached as "tools:replbox"; the global
# environment stays the user's.
local({
  nonce <- {nonce:json}
  ctl <- {ctl:json}
  out <- {out:json}
  cell_file <- {cell_file:json}
  input_file <- {input_file:json}
  max_images <- {max_images}
  user_limit <- {sync_base}  # internal evaluations (resynchronisation) are numbered from here

  # Prompts carry the nonce; tables print for a wide terminal (as pandas does, 200 columns).
  # The prompts are ours between cells (replbox recognises them) and the user's while a cell
  # runs: `options(prompt = "R> ")` is kept for the code that reads it, never printed.
  our_prompts <- list(prompt = {prompt:json}, continue = {continuation:json})
  user_prompts <- list(prompt = "> ", continue = "+ ")
  options(our_prompts)
  options(width = 200, useFancyQuotes = FALSE, menu.graphics = FALSE)

  num <- function(n) format.default(n, scientific = FALSE, trim = TRUE)

  # Markers go to the terminal itself, in one write, so code that diverted its output with
  # sink() does not swallow them.
  tty <- tryCatch(file("/dev/tty", open = "wb"), error = function(e) NULL)
  emit <- function(s) {
    try(flush(stdout()), silent = TRUE)
    try(flush(stderr()), silent = TRUE)
    bytes <- charToRaw(enc2utf8(s))
    if (is.null(tty)) {
      cat(s)
      flush(stdout())
    } else {
      writeBin(bytes, tty)
      flush(tty)
    }
  }

  # --- the end marker's payload: base64 of a small JSON object, with base R only ---
  b64 <- function(x) {
    if (length(x) == 0) return("")
    chars <- strsplit(
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", "")[[1]]
    pad <- (3 - length(x) %% 3) %% 3
    v <- matrix(c(as.integer(x), integer(pad)), nrow = 3)
    w <- v[1, ] * 65536 + v[2, ] * 256 + v[3, ]
    idx <- rbind(w %/% 262144, (w %/% 4096) %% 64, (w %/% 64) %% 64, w %% 64) + 1
    s <- chars[idx]
    if (pad > 0) s[(length(s) - pad + 1):length(s)] <- "="
    paste(s, collapse = "")
  }
  # Strings as UTF-8 whatever their bytes: bytes that are not UTF-8 become <xx>, so that no
  # string function fails on them; cut to n characters.
  clean <- function(s, n = 200) {
    s <- enc2utf8(as.character(unclass(s)))
    bad <- !is.na(s) & !validUTF8(s)
    if (any(bad)) s[bad] <- iconv(s[bad], "UTF-8", "UTF-8", sub = "byte")
    if (is.null(n)) s else substr(s, 1, n)
  }
  js <- function(s) {
    s <- clean(unclass(s)[1], NULL)
    if (is.na(s)) s <- "NA"
    for (p in list(c("\\", "\\\\"), c("\"", "\\\""), c("\n", "\\n"), c("\r", "\\r"),
                   c("\t", "\\t")))
      s <- gsub(p[1], p[2], s, fixed = TRUE)
    paste0("\"", gsub("[[:cntrl:]]", " ", s), "\"")
  }
  payload <- function(fields) {
    if (length(fields) == 0) return("")
    body <- paste0("{", paste(names(fields), fields, sep = ":", collapse = ","), "}")
    b64(charToRaw(enc2utf8(body)))
  }

  # --- warnings: kept during a cell and printed after each expression, as R's REPL does
  # after each top-level call (with options(warn = 0), the default) ---
  top <- quote(eval(expr, envir = globalenv()))
  at_top <- function(call) is.null(call) || identical(call, top)
  cell <- new.env()
  # What traceback() and warnings() show: R keeps them in the base environment, which is
  # locked (nothing new can be added there), and its own would list replbox's frames.
  kept <- new.env()
  kept$calls <- NULL
  kept$warnings <- NULL
  # The calls of a cell's code from sys.calls() in a handler: after replbox's eval, without
  # the handler's own frame (and R's .handleSimpleError), most recent first.
  user_calls <- function(calls) {
    mine <- which(vapply(calls, function(cl) identical(cl, top), NA))
    if (length(mine) > 0) calls <- calls[-seq_len(max(mine))]
    n <- length(calls)
    if (n > 0) calls <- calls[-n]
    n <- length(calls)
    if (n > 0 && identical(calls[[n]][[1]], quote(.handleSimpleError))) calls <- calls[-n]
    rev(calls)
  }
  cell$warns <- list()
  # As R: a top-level call's warnings are kept (the first `nwarnings`, 50 by default) for
  # warnings(), and shown after it; more than 10 only counted.
  print_warnings <- function(prefix = "") {
    w <- cell$warns
    cell$warns <- list()
    if (length(w) == 0) return(invisible())
    most <- suppressWarnings(as.integer(getOption("nwarnings", 50L)))
    if (length(most) != 1 || is.na(most) || most < 1) most <- 50L
    total <- length(w)
    w <- w[seq_len(min(total, most))]
    calls <- lapply(w, function(c) if (at_top(conditionCall(c))) NULL else conditionCall(c))
    names(calls) <- vapply(w, conditionMessage, "")
    kept$warnings <- calls
    if (total >= most) {
      cat(sprintf("%sThere were %d or more warnings (use warnings() to see the first %d)\n",
                  prefix, most, most), file = stderr())
    } else if (total > 10) {
      cat(sprintf("%sThere were %d warnings (use warnings() to see them)\n", prefix, total),
          file = stderr())
    } else {
      cat(prefix, file = stderr())
      # R's own formatting of deferred warnings ("Warning message:\nIn log(-1) : NaNs produced").
      out <- utils::capture.output(print(structure(calls, class = "warnings")))
      cat(out, sep = "\n", file = stderr())
    }
  }

  # --- figures: plots are drawn on a device of the session's own (cairo, to /dev/null)
  # with its display list on; every page a cell finished, and the current page when the
  # cell changed it, is replayed into a PNG in out/ ---
  size <- list(width = 7, height = 5, units = "in", res = 96)
  bitmap <- function() if (isTRUE(capabilities("cairo"))) "cairo" else getOption("bitmapType")
  figs <- new.env()
  figs$count <- 0
  figs$devs <- list()      # by device number: list(fig = figure number, sent = last plot sent)
  figs$rendering <- FALSE
  ours <- function(d = grDevices::dev.cur()) {
    d > 1 && identical(attr(.Devices[[d]], "filepath"), "/dev/null") &&
      !is.null(figs$devs[[as.character(d)]])
  }
  new_device <- function(...) {
    grDevices::png("/dev/null", width = size$width, height = size$height,
                   units = size$units, res = size$res, type = bitmap())
    grDevices::dev.control(displaylist = "enable")
    figs$devs[[as.character(grDevices::dev.cur())]] <- list(fig = NULL, sent = NULL)
    invisible()
  }
  options(device = new_device)
  # What a page shows: its display list without par() calls, which change settings (a
  # new mfrow, margins) but draw nothing.
  drawn <- function(p) {
    Filter(function(e) !identical(tryCatch(e[[2]][[1]]$name, error = function(x) NULL),
                                  "C_par"), p[[1]])
  }
  snapshot <- function() {
    d <- grDevices::dev.cur()
    if (!ours(d) || is.null(cell$n) || cell$n >= user_limit) return(invisible())
    key <- as.character(d)
    st <- figs$devs[[key]]
    p <- tryCatch(grDevices::recordPlot(), error = function(e) NULL)
    if (is.null(p) || length(drawn(p)) == 0) return(invisible())
    if (!is.null(st$sent) && identical(drawn(p), st$sent)) return(invisible())
    if (is.null(st$fig)) {
      figs$count <- figs$count + 1
      st$fig <- figs$count
    }
    st$sent <- drawn(p)
    figs$devs[[key]] <- st
    if (length(cell$plots) >= max_images) {
      cell$omitted <- cell$omitted + 1
    } else {
      cell$plots[[length(cell$plots) + 1]] <- list(plot = p, fig = st$fig)
    }
    invisible()
  }
  # A page about to be replaced is kept first; a new page gets a new figure number.
  page_ends <- function() {
    if (figs$rendering || !ours()) return(invisible())
    snapshot()
    key <- as.character(grDevices::dev.cur())
    figs$devs[[key]] <- list(fig = NULL, sent = NULL)
  }
  setHook("before.plot.new", function() {
    if (ours() && isTRUE(graphics::par("page"))) page_ends()
  })
  setHook("before.grid.newpage", function() page_ends())
  render <- function(n) {
    shots <- list()
    plots <- cell$plots
    cell$plots <- list()
    figs$rendering <- TRUE
    on.exit(figs$rendering <- FALSE)
    for (i in seq_along(plots)) {
      name <- sprintf("img-%s-%d.png", num(n), i)
      old <- grDevices::dev.cur()
      ok <- tryCatch({
        grDevices::png(file.path(out, name), width = size$width, height = size$height,
                       units = size$units, res = size$res, type = bitmap())
        tryCatch(suppressWarnings(grDevices::replayPlot(plots[[i]]$plot)),
                 finally = grDevices::dev.off())
        TRUE
      }, error = function(e) {
        cat(sprintf("[replbox: figure %d could not be drawn: %s]\n", plots[[i]]$fig,
                    conditionMessage(e)), file = stderr())
        FALSE
      })
      if (old > 1 && old %in% grDevices::dev.list()) grDevices::dev.set(old)
      if (ok) {
        shots[[length(shots) + 1]] <- sprintf("{\"file\":%s,\"figure\":%d}", js(name),
                                              as.integer(plots[[i]]$fig))
        try(svg_of(plots[[i]]$plot, n, i), silent = TRUE)
      }
    }
    shots
  }
  # The same plot as SVG, kept by replbox as a resource and only linked from the result (the
  # PNG is what the reader sees): with cairo's svg device, unless options(replbox.svg =
  # FALSE). An SVG grows with every point drawn (100,000 points: 30 MB, seconds to write),
  # so a plot whose recorded drawing is large gets none: over 300 kB for base graphics
  # (about 10,000 points), 2.5 MB for grid's (ggplot2 records 1.3 MB for a few points);
  # nor does an SVG over 4 MiB.
  svg_of <- function(p, n, i) {
    if (!isTRUE(capabilities("cairo")) || !isTRUE(getOption("replbox.svg", TRUE)) ||
        length(cell$displays) >= max_displays) return(invisible())
    calls <- vapply(p[[1]], function(e)
      tryCatch(as.character(e[[2]][[1]]$name)[1], error = function(x) ""), "")
    grid <- !any(startsWith(calls, "C_"), na.rm = TRUE)  # base graphics' calls are C_*
    if (as.numeric(utils::object.size(p)) > if (grid) 2.5e6 else 3e5) return(invisible())
    path <- file.path(out, sprintf("img-%s-%d.svg", num(n), i))
    on.exit(unlink(path))
    old <- grDevices::dev.cur()
    grDevices::svg(path, width = size$width, height = size$height)
    tryCatch(suppressWarnings(grDevices::replayPlot(p)), finally = grDevices::dev.off())
    if (old > 1 && old %in% grDevices::dev.list()) grDevices::dev.set(old)
    bytes <- file.size(path)
    if (is.na(bytes) || bytes > 4 * 2^20) return(invisible())
    text <- readChar(path, bytes, useBytes = TRUE)
    name <- sprintf("disp-%s-%d.json", num(n), length(cell$displays) + 1)
    writeLines(paste0("{\"data\":{\"image/svg+xml\":", js(text), "},\"linked\":true}"),
               file.path(out, name), useBytes = TRUE)
    cell$displays[[length(cell$displays) + 1]] <- sprintf("{\"file\":%s}", js(name))
    invisible()
  }

  # Input typed into this cell (replbox says so with a file) that the program did not read
  # would be the REPL's next line: read the whole lines of it out of the terminal (a
  # descriptor of its own, non-blocking, so the REPL's stdin is left as it is) and count
  # them. A line without Enter cannot reach the REPL; replbox drops it before the next cell.
  discard_unread <- function(n) {
    if (!file.exists(file.path(ctl, sub("{n}", num(n), input_file, fixed = TRUE)))) return(0)
    con <- tryCatch(suppressWarnings(file("/dev/tty", open = "rb", blocking = FALSE,
                                          raw = TRUE)),
                    error = function(e) NULL)
    if (is.null(con)) return(0)
    on.exit(close(con))
    count <- 0
    while (count < 2^24) {
      got <- tryCatch(readBin(con, "raw", 65536), error = function(e) raw())
      if (length(got) == 0) break
      count <- count + length(got)
    }
    count
  }

  # --- what replbox reads without printing: data frames as data, and session_vars. Every
  # value is the user's: nothing here dispatches on its class (unclass, attributes and
  # primitives only), so no method of theirs runs; replbox bounds what it reads again. An
  # attribute's value may carry a class of its own: `at` reads it unclassed. ---
  at <- function(x, which) unclass(attr(x, which, exact = TRUE))
  jnum <- function(v) ifelse(is.finite(v), sprintf("%.0f", v), "null")
  # A double stays one in JSON (1.0, not 1), as pandas writes it.
  jdbl <- function(v) {
    s <- sprintf("%.15g", v)
    s <- ifelse(grepl("^-?[0-9]+$", s), paste0(s, ".0"), s)
    ifelse(is.finite(v), s, "null")
  }
  # The JSON values of rows `rows` of one column.
  cells <- function(col, rows) {
    cls <- at(col, "class")
    u <- unclass(col)
    if (!is.atomic(u) || !is.null(at(u, "dim"))) return(rep(js(typeof(u)), length(rows)))
    v <- u[rows]
    if (is.factor(col)) {
      lv <- at(col, "levels")
      return(ifelse(is.na(v), "null", vapply(clean(lv[v]), js, "")))
    }
    if ("Date" %in% cls && is.numeric(v))
      return(ifelse(is.finite(v), vapply(format(as.Date(unclass(v), origin = "1970-01-01")), js, ""), "null"))
    if ("POSIXct" %in% cls && is.numeric(v))
      return(ifelse(is.finite(v), vapply(strftime(.POSIXct(unclass(v), tz = "UTC"),
                                                  "%Y-%m-%dT%H:%M:%SZ", tz = "UTC"), js, ""), "null"))
    if (is.logical(v)) return(ifelse(is.na(v), "null", ifelse(v, "true", "false")))
    if (is.integer(v)) return(ifelse(is.na(v), "null", sprintf("%d", v)))
    if (is.double(v)) return(jdbl(v))
    if (is.character(v)) return(ifelse(is.na(v), "null", vapply(clean(v), js, "")))
    rep(js(typeof(u)), length(rows))
  }
  frame_json <- function(x) {
    u <- unclass(x)
    nr <- .row_names_info(x, 2L)
    cols <- u[seq_len(min(length(u), 50))]
    names(cols) <- clean(at(u, "names")[seq_along(cols)])
    kinds <- vapply(cols, function(c) {
      k <- at(c, "class")
      clean(if (is.null(k)) typeof(c) else k[1])
    }, "")
    columns <- paste(sprintf("{\"name\":%s,\"dtype\":%s}", vapply(names(cols), js, ""),
                             vapply(kinds, js, "")), collapse = ",")
    # Row names of its own (mtcars' models) go into the records as a column, as pandas'
    # index does.
    if (.row_names_info(x) > 0) cols <- c(list("_row" = clean(at(x, "row.names"))), cols)
    records <- function(rows) {
      if (length(rows) == 0) return("[]")
      vals <- lapply(cols, cells, rows = rows)
      keys <- vapply(names(cols), js, "")
      recs <- vapply(seq_along(rows), function(i)
        paste0("{", paste0(keys, ":", vapply(vals, `[`, "", i), collapse = ","), "}"), "")
      paste0("[", paste(recs, collapse = ","), "]")
    }
    type <- at(x, "class")[1]
    parts <- c(sprintf("\"type\":%s", js(if (is.null(type)) "data.frame" else type)),
               sprintf("\"shape\":[%d,%d]", as.integer(nr), length(u)),
               sprintf("\"columns\":[%s]", columns))
    if (nr <= 10) {
      parts <- c(parts, sprintf("\"head\":%s", records(seq_len(nr))))
    } else {
      parts <- c(parts, sprintf("\"head\":%s", records(1:5)),
                 sprintf("\"tail\":%s", records((nr - 4):nr)))
    }
    paste0("{", paste(parts, collapse = ","), "}")
  }
  max_displays <- 16
  publish <- function(x) {
    if (is.null(cell$n) || cell$n >= user_limit || !is.data.frame(x)) return(invisible())
    if (length(cell$displays) >= max_displays) {
      cell$displays_omitted <- cell$displays_omitted + 1
      return(invisible())
    }
    body <- tryCatch(frame_json(x), error = function(e) NULL)
    if (is.null(body)) return(invisible())
    name <- sprintf("disp-%s-%d.json", num(cell$n), length(cell$displays) + 1)
    ok <- tryCatch({
      writeLines(paste0("{\"data\":{},\"frame\":", body, "}"), file.path(out, name),
                 useBytes = TRUE)
      TRUE
    }, error = function(e) FALSE)
    if (ok) cell$displays[[length(cell$displays) + 1]] <- sprintf("{\"file\":%s}", js(name))
    invisible()
  }
  # A name's entry for session_vars: type, kind, a one-line summary and its size.
  describe <- function(name, env) {
    if (bindingIsActive(name, env)) {
      return(list(type = "active binding", kind = "data", summary = ""))
    }
    x <- get(name, envir = env, inherits = FALSE)
    type <- at(x, "class")[1]
    type <- clean(if (is.null(type)) typeof(x) else type)
    if (is.function(x)) {
      fm <- formals(x)
      args <- vapply(seq_along(fm), function(i) {
        d <- deparse(fm[[i]], width.cutoff = 60L)[1]
        n <- clean(at(fm, "names")[i])
        if (nzchar(d)) paste0(n, " = ", clean(d)) else n
      }, "")
      return(list(type = "function", kind = "function",
                  summary = paste0("function(", paste(args, collapse = ", "), ")")))
    }
    u <- unclass(x)
    summary <- if (is.data.frame(x)) {
      kinds <- vapply(u, function(c) { k <- at(c, "class"); clean(if (is.null(k)) typeof(c) else k[1]) }, "")
      sprintf("%d x %d: %s", .row_names_info(x, 2L), length(u),
              paste(paste0(clean(at(u, "names")), " <", kinds, ">")[seq_len(min(length(u), 20))], collapse = ", "))
    } else if (is.atomic(u)) {
      d <- at(u, "dim")
      shape <- if (is.null(d)) sprintf("[%d]", length(u)) else sprintf("[%s]", paste(d, collapse = "x"))
      i <- seq_len(min(length(u), 6))
      v <- if (is.factor(x)) at(x, "levels")[u[i]] else u[i]
      shown <- if (is.character(v)) paste0("\"", clean(v, 40), "\"") else format.default(v, digits = 6)
      paste(c(typeof(u), shape, shown, if (length(u) > 6) "..."), collapse = " ")
    } else if (is.list(u)) {
      nm <- at(u, "names")
      sprintf("list of %d%s", length(u),
              if (is.null(nm)) "" else paste0(": ", paste(clean(nm[seq_len(min(length(nm), 10))]), collapse = ", ")))
    } else typeof(u)
    size <- tryCatch(as.numeric(utils::object.size(x)), error = function(e) NA)
    list(type = type, kind = "data", summary = summary, size = size)
  }
  vars <- function() {
    env <- globalenv()
    names <- ls(env, sorted = TRUE)
    found <- character()
    used <- 2
    omitted <- 0
    for (name in names) {
      if (used > 11000) { omitted <- omitted + 1; next }
      # One name at a time: whatever fails for one (its bytes, its value) fails only its
      # own entry, and every string in an entry is cut, so no one entry takes the budget.
      e <- tryCatch(describe(name, env),
                    error = function(c) list(type = "?", kind = "data", summary = ""))
      item <- tryCatch(
        sprintf("{\"name\":%s,\"type\":%s,\"kind\":%s,\"summary\":%s%s}", js(clean(name)),
                js(clean(e$type)), js(e$kind), js(clean(e$summary)),
                if (is.null(e$size) || is.na(e$size)) "" else sprintf(",\"size\":%s", jnum(e$size))),
        error = function(c) NULL)
      if (is.null(item)) { omitted <- omitted + 1; next }
      if (used + nchar(item, "bytes") + 1 > 11000) { omitted <- omitted + 1; used <- 11001; next }
      used <- used + nchar(item, "bytes") + 1
      found <- c(found, item)
    }
    cell$extra[["vars"]] <- paste0("[", paste(found, collapse = ","), "]")
    if (omitted > 0) cell$extra[["vars_omitted"]] <- num(omitted)
    invisible()
  }

  # --- session_inspect: one name looked at within a budget, read as session_vars reads
  # (unclassed, attributes, primitives and .Internal calls: no S3 or S4 method of the
  # value's classes runs, nor one a user defined for a type's implicit class), bounded: 50
  # columns, distinct values counted on the first million, 20 values shown, 500 lines of
  # source. An answer is a list of fields, each raw JSON, a text or an array of JSON items,
  # cut to the budget here (and again by replbox). ---
  raw_f <- function(v) list(k = "raw", v = v)
  str_f <- function(v) list(k = "str", v = clean(v, 20000))
  arr_f <- function(v) list(k = "arr", v = as.character(v))
  ser <- function(e) switch(e$k, raw = e$v, str = js(e$v),
                            arr = paste0("[", paste(e$v, collapse = ","), "]"))
  fit <- function(f, budget) {
    size <- function() 20 + sum(vapply(names(f), function(n)
      nchar(n, "bytes") + 4 + nchar(ser(f[[n]]), "bytes"), 0))
    cut <- FALSE
    for (i in 1:64) {
      if (size() <= budget) break
      cut <- TRUE
      lens <- vapply(f, function(e) if (e$k == "arr" && length(e$v) > 1 ||
                                        e$k == "str" && nchar(e$v) > 1)
        nchar(ser(e), "bytes") else 0, 0)
      if (max(lens) == 0) break
      k <- which.max(lens)
      e <- f[[k]]
      if (e$k == "arr") e$v <- e$v[seq_len(length(e$v) %/% 2)]
      else e$v <- paste0(substr(e$v, 1, max(1, nchar(e$v) %/% 2)), "...")
      f[[k]] <- e
    }
    while (size() > budget && length(f) > 2) f[[length(f)]] <- NULL
    if (cut) f$truncated <- raw_f("true")
    paste0("{", paste(vapply(names(f), js, ""), vapply(f, ser, ""), sep = ":",
                      collapse = ","), "}")
  }
  unhex <- function(h) {
    n <- nchar(h)
    if (n == 0 || n %% 2 == 1) stop("not a name")
    rawToChar(as.raw(strtoi(substring(h, seq(1, n, 2), seq(2, n, 2)), 16L)))
  }
  # The value of a name: a variable of the global environment (its name may hold dots), then
  # elements of a list or an environment for the rest of the dotted path. A promise in an
  # environment along the path is not forced: its expression is what is shown.
  lookup <- function(path) {
    env <- globalenv()
    parts <- strsplit(path, ".", fixed = TRUE)[[1]]
    k <- length(parts)
    while (k > 0 && !exists(paste(parts[1:k], collapse = "."), envir = env, inherits = FALSE))
      k <- k - 1
    if (k == 0) stop(sprintf("object '%s' not found", clean(path)), call. = FALSE)
    name <- paste(parts[1:k], collapse = ".")
    if (bindingIsActive(name, env))
      stop(sprintf("%s is an active binding: it is not run", clean(name)), call. = FALSE)
    x <- get(name, envir = env, inherits = FALSE)
    for (p in parts[-seq_len(k)]) {
      if (is.environment(x)) {
        if (!exists(p, envir = x, inherits = FALSE))
          stop(sprintf("%s has no %s", clean(name), clean(p)), call. = FALSE)
        if (bindingIsActive(p, x))
          stop(sprintf("%s$%s is an active binding: it is not run", clean(name), clean(p)),
               call. = FALSE)
        # substitute() gives a promise's expression rather than forcing it (a value as
        # it is); in the global environment, which substitute() leaves alone, the name is
        # read as a top-level one is.
        x <- if (identical(x, globalenv())) get(p, envir = x, inherits = FALSE)
             else eval(call("substitute", as.name(p), x))
      } else {
        u <- unclass(x)
        i <- if (is.list(u)) match(p, at(u, "names")) else NA
        if (is.na(i)) stop(sprintf("%s has no element %s", clean(name), clean(p)), call. = FALSE)
        x <- .subset2(u, i)
      }
      name <- paste0(name, "$", p)
    }
    x
  }
  # A function's source: its own lines when it kept them (cells are parsed with their
  # source), else deparsed; at most 500 lines.
  fn_source <- function(f) {
    lines <- tryCatch({
      sr <- attr(f, "srcref", exact = TRUE)
      r <- as.integer(unclass(sr))
      sf <- attr(sr, "srcfile", exact = TRUE)
      # The srcfile is any environment the session made: its `lines` is read with
      # substitute(), which gives a promise's expression rather than forcing it, and an
      # active binding is not read at all.
      all <- if (is.environment(sf) && exists("lines", envir = sf, inherits = FALSE) &&
                 !bindingIsActive("lines", sf))
        unclass(eval(call("substitute", as.name("lines"), sf)))
      if (length(r) < 6 || !is.character(all) || r[3] > length(all) || r[1] < 1) NULL else {
        l <- all[r[1]:min(r[3], r[1] + 499)]
        if (r[3] - r[1] < 500) l[length(l)] <- substr(l[length(l)], 1, r[6])
        l[1] <- substr(l[1], r[5], nchar(l[1]))
        l
      }
    }, error = function(e) NULL)
    if (is.null(lines)) lines <- deparse(unclass(f), width.cutoff = 80L, nlines = 500L)
    paste(clean(lines, 2000), collapse = "\n")
  }
  stats_of <- function(u) {
    v <- u[is.finite(u)]
    n <- length(v)
    missing <- length(u) - n
    if (n == 0) return(raw_f(sprintf("{\"nans\":%d}", missing)))
    m <- sum(v) / n
    s <- if (n > 1) sqrt(sum((v - m)^2) / (n - 1)) else 0
    raw_f(sprintf("{\"min\":%s,\"max\":%s,\"mean\":%s,\"sd\":%s,\"nans\":%d}", jdbl(min(v)),
                  jdbl(max(v)), jdbl(m), jdbl(s), missing))
  }
  distinct <- function(u) {
    if (!is.atomic(u) || length(u) == 0) return(if (is.atomic(u)) 0 else NA)
    attributes(u) <- NULL
    if (length(u) > 1e6) u <- u[seq_len(1e6)]
    # Missing values are not a distinct value, as pandas counts them.
    uq <- .Internal(unique(u, FALSE, FALSE, NA))
    length(uq) - sum(is.na(uq))
  }
  frame_records <- function(x, rows) {
    u <- unclass(x)
    cols <- u[seq_len(min(length(u), 50))]
    names(cols) <- clean(at(u, "names")[seq_along(cols)])
    if (.row_names_info(x) > 0) cols <- c(list("_row" = at(x, "row.names")), cols)
    if (length(rows) == 0) return(character())
    vals <- lapply(cols, cells, rows = rows)
    keys <- vapply(names(cols), js, "")
    vapply(seq_along(rows), function(i)
      paste0("{", paste0(keys, ":", vapply(vals, `[`, "", i), collapse = ","), "}"), "")
  }
  inspect_value <- function(x) {
    cls <- at(x, "class")
    f <- list(type = str_f(if (is.null(cls)) typeof(x) else cls[1]))
    tmp <- new.env()
    assign("v", x, envir = tmp)
    d <- tryCatch(describe("v", tmp), error = function(e) NULL)
    if (!is.null(d)) {
      f$summary <- str_f(d$summary)
      if (!is.null(d$size) && !is.na(d$size)) f$size <- raw_f(jnum(d$size))
    }
    u <- unclass(x)
    if (is.data.frame(x)) {
      nr <- .row_names_info(x, 2L)
      f$kind <- raw_f("\"table\"")
      f$shape <- raw_f(sprintf("[%d,%d]", as.integer(nr), length(u)))
      cols <- u[seq_len(min(length(u), 50))]
      nm <- clean(at(u, "names")[seq_along(cols)])
      f$columns <- arr_f(vapply(seq_along(cols), function(i) {
        col <- cols[[i]]
        k <- at(col, "class")
        v <- unclass(col)
        sprintf("{\"name\":%s,\"dtype\":%s,\"nulls\":%s,\"distinct\":%s}", js(nm[i]),
                js(clean(if (is.null(k)) typeof(v) else k[1])),
                jnum(if (is.atomic(v) || is.list(v)) sum(is.na(v)) else NA), jnum(distinct(v)))
      }, ""))
      if (length(u) > 50) f$columns_omitted <- raw_f(jnum(length(u) - 50))
      f$head <- arr_f(frame_records(x, seq_len(min(nr, 5))))
      if (nr > 5) f$tail <- arr_f(frame_records(x, max(6, nr - 4):nr))
    } else if (is.function(x)) {
      f$kind <- raw_f("\"function\"")
      f$signature <- str_f(if (is.null(d)) "function" else d$summary)
      f$source <- str_f(fn_source(x))
    } else if (is.atomic(u)) {
      dim <- at(u, "dim")
      f$kind <- raw_f("\"array\"")
      f$len <- raw_f(jnum(length(u)))
      if (!is.null(dim)) f$shape <- arr_f(jnum(dim))
      f$dtype <- str_f(typeof(u))
      f$nulls <- raw_f(jnum(sum(is.na(u))))
      if (is.factor(x)) {
        lv <- at(x, "levels")
        f$levels <- arr_f(vapply(clean(lv[seq_len(min(length(lv), 20))]), js, ""))
      } else if (is.numeric(u)) {
        f$stats <- stats_of(u)
      }
      if (length(u) > 0) f$distinct <- raw_f(jnum(distinct(u)))
      n <- min(length(u), 20)
      flat <- if (is.null(dim)) x else { w <- u; attributes(w) <- NULL; w }
      f$head <- arr_f(cells(flat, seq_len(n)))
    } else if (is.list(u)) {
      f$kind <- raw_f("\"list\"")
      f$len <- raw_f(jnum(length(u)))
      nm <- at(u, "names")
      n <- min(length(u), 30)
      f$members <- arr_f(vapply(seq_len(n), function(i) {
        e <- .subset2(u, i)
        k <- at(e, "class")
        sprintf("{\"name\":%s,\"type\":%s}", js(if (is.null(nm)) "" else clean(nm[i])),
                js(clean(if (is.null(k)) typeof(e) else k[1])))
      }, ""))
    } else if (is.environment(x)) {
      names <- ls(x, all.names = TRUE, sorted = FALSE)
      f$kind <- raw_f("\"environment\"")
      f$len <- raw_f(jnum(length(names)))
      f$members <- arr_f(vapply(clean(names[seq_len(min(length(names), 50))]), js, ""))
    } else {
      f$repr <- str_f(paste(deparse(u, width.cutoff = 80L, nlines = 50L), collapse = "\n"))
    }
    f
  }
  inspect <- function(hex, budget) {
    out <- tryCatch(fit(inspect_value(lookup(unhex(hex))), max(200, budget)),
                    error = function(e) sprintf("{\"error\":%s}",
                                                js(paste0("Error: ", conditionMessage(e)))))
    cell$extra[["inspect"]] <- out
    invisible()
  }

  # --- one cell: each expression evaluated in the global environment as if typed, a
  # visible value printed as the REPL prints it; the first error ends the cell ---
  # Interrupts: only the cell's code takes them. run() suspends them from its first
  # expression and allows them around the code only; the end (finish) runs suspended, and
  # an interrupt still pending once the end marker is out came too late for the cell: it is
  # taken there, where it stops nothing.
  suspend <- function() .Internal(interruptsSuspended(TRUE))
  drop_late <- function() {
    tryCatch({
      .Internal(interruptsSuspended(FALSE))
      for (i in 1:2) NULL  # a point where R looks for a pending interrupt
    }, interrupt = function(c) NULL)
  }
  finish <- function(n, state) {
    suspend()
    on.exit(drop_late())
    fields <- character()
    try(print_warnings(if (state$status == "error") "In addition: " else ""), silent = TRUE)
    if (n < user_limit) {
      try(snapshot(), silent = TRUE)
      shots <- tryCatch(render(n), error = function(e) list())
      if (length(shots) > 0)
        fields["images"] <- paste0("[", paste(unlist(shots), collapse = ","), "]")
      if (cell$omitted > 0) fields["images_omitted"] <- num(cell$omitted)
      if (length(cell$displays) > 0)
        fields["displays"] <- paste0("[", paste(unlist(cell$displays), collapse = ","), "]")
      if (cell$displays_omitted > 0) fields["displays_omitted"] <- num(cell$displays_omitted)
    }
    for (k in names(cell$extra)) fields[k] <- cell$extra[[k]]
    if (!is.null(state$type)) {
      fields["type"] <- js(state$type)
      fields["message"] <- js(substr(state$message, 1, 2000))
    }
    unread <- tryCatch(discard_unread(n), error = function(e) 0)
    if (unread > 0) fields["unread"] <- num(unread)
    user_prompts <<- tryCatch(list(prompt = getOption("prompt"), continue = getOption("continue")),
                              error = function(e) user_prompts)
    options(our_prompts)
    names(fields) <- vapply(names(fields), js, "")
    cell$n <- NULL
    emit(sprintf("\033_rbx;%s;e;%s;%s;%s\033\\", nonce, num(n), state$status, payload(fields)))
  }
  set_last <- function(value) {
    try({
      unlockBinding(".Last.value", baseenv())
      assign(".Last.value", value, envir = baseenv())
      lockBinding(".Last.value", baseenv())
    }, silent = TRUE)
  }
  show <- function(value) {
    if (isS4(value)) methods::show(value) else print(value)
  }
  run <- function(n) {
    suspend()
    state <- new.env()
    state$status <- "ok"
    cell$n <- n
    cell$plots <- list()
    cell$omitted <- 0
    cell$warns <- list()
    cell$displays <- list()
    cell$displays_omitted <- 0
    cell$extra <- list()
    last <- get(".Last.value", envir = baseenv())
    # Runs however the cell ends: normally, or unwound to the prompt by an error (after R
    # printed it), an interrupt or an abort.
    on.exit(finish(n, state))
    try(options(user_prompts), silent = TRUE)
    emit(sprintf("\033_rbx;%s;s;%s\033\\", nonce, num(n)))
    path <- file.path(ctl, sub("{n}", num(n), cell_file, fixed = TRUE))
    src <- readLines(path, encoding = "UTF-8", warn = FALSE)
    name <- sprintf("<cell %s>", num(n))
    exprs <- tryCatch(parse(text = src, srcfile = srcfilecopy(name, src), keep.source = TRUE,
                            encoding = "UTF-8"),
                      error = function(e) e)
    if (inherits(exprs, "error")) {
      state$status <- "error"
      state$type <- class(exprs)[1]
      state$message <- conditionMessage(exprs)
      cat("Error: ", conditionMessage(exprs), "\n", sep = "", file = stderr())
      return(invisible(last))
    }
    withCallingHandlers(allowInterrupts({
      for (expr in exprs) {
        res <- withVisible(eval(expr, envir = globalenv()))
        if (n < user_limit) {
          last <- res$value
          set_last(last)
        }
        if (res$visible) {
          show(res$value)
          publish(res$value)
        }
        print_warnings()
      }
    }),
    warning = function(w) {
      if (isTRUE(getOption("warn", 0) == 0)) {
        cell$warns[[length(cell$warns) + 1]] <- w
        invokeRestart("muffleWarning")
      }
    },
    error = function(e) {
      state$status <- "error"
      state$type <- class(e)[1]
      state$message <- conditionMessage(e)
      kept$calls <- user_calls(sys.calls())
      if (at_top(conditionCall(e))) {
        # R would name replbox's own call; at a prompt it says just "Error: ...".
        cat("Error: ", conditionMessage(e), "\n", sep = "", file = stderr())
        invokeRestart("abort")
      }
    },
    interrupt = function(c) {
      kept$calls <- user_calls(sys.calls())
      state$status <- "interrupted"
      state$type <- "interrupt"
      state$message <- "interrupted"
    })
    invisible(last)
  }

  # What runs in every cell, compiled now. R's JIT compiles a function of this environment
  # at its second call, and the resynchronising cell at start is the first: left to it, run
  # itself was compiled after the first cell's line was typed and before its code started
  # (0.16-0.43 s at load 13, inside the cell's deadline, which then could stop the code
  # before its first expression), what runs between expressions between the first two, and
  # finish after the code. A deadline meant to find the cell in its code could fall there.
  here <- environment()
  for (name in c("run", "finish", "drop_late", "set_last", "show", "publish",
                 "print_warnings", "snapshot", "render", "discard_unread", "user_calls",
                 "emit", "payload", "js")) {
    assign(name, compiler::cmpfun(get(name, envir = here)), envir = here)
  }

  tools <- attach(NULL, name = "tools:replbox")
  assign(".rbx_eval", run, envir = tools)
  assign(".rbx_vars", vars, envir = tools)
  assign(".rbx_inspect", inspect, envir = tools)
  # As IRkernel's display(): each object printed, a data frame also returned as data.
  assign("display", function(...) {
    for (x in list(...)) {
      show(x)
      publish(x)
    }
    invisible()
  }, envir = tools)
  # Before base on the search path: the last cell's error and warnings, else base's own.
  assign("traceback", function(x = NULL, ...) {
    if (is.null(x) && !is.null(kept$calls)) x <- kept$calls
    base::traceback(x, ...)
  }, envir = tools)
  # Only the user's cells' warnings: none yet is R's answer at a fresh prompt (base's
  # last.warning may hold one of the bootstrap's own).
  assign("warnings", function(...) {
    if (...length() == 0) {
      if (is.null(kept$warnings)) return(invisible(NULL))
      return(structure(kept$warnings, class = "warnings"))
    }
    base::warnings(...)
  }, envir = tools)
})
