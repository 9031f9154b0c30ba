# replbox: what the session gave its cells that a notebook or a script does not, so that
# they run again as they ran there: the answers typed at their prompts, which the cells'
# readline(), readLines() and scan() of the console or standard input, and menu(), get in
# order (kept in an environment on the search path, ahead of base R's own).
local({
  answers <- {answers:r}
  pos <- 1L
  line <- function() {
    if (pos > nchar(answers)) return(NULL)
    rest <- substr(answers, pos, nchar(answers))
    nl <- regexpr("\n", rest, fixed = TRUE)
    if (nl < 0) {
      pos <<- nchar(answers) + 1L
      return(rest)
    }
    pos <<- pos + nl
    substr(rest, 1L, nl - 1L)
  }
  console <- function(con) {
    (is.character(con) && length(con) == 1L && con %in% c("", "stdin")) ||
      (inherits(con, "connection") && identical(summary(con)$description, "stdin"))
  }
  e <- new.env()
  e$readline <- function(prompt = "") {
    cat(prompt)
    l <- line()
    if (is.null(l)) "" else l
  }
  e$readLines <- function(con = stdin(), n = -1L, ok = TRUE, warn = TRUE, encoding = "unknown",
                          skipNul = FALSE) {
    if (!console(con)) {
      return(base::readLines(con, n, ok, warn, encoding, skipNul))
    }
    out <- character()
    while (n < 0L || length(out) < n) {
      l <- line()
      if (is.null(l)) break
      out <- c(out, l)
    }
    out
  }
  e$scan <- function(file = "", what = double(), nmax = -1L, n = -1L, sep = "", ...,
                     nlines = 0L, quiet = FALSE) {
    if (!console(file)) {
      return(base::scan(file, what, nmax, n, sep, ..., nlines = nlines, quiet = quiet))
    }
    # As from the console: lines up to an empty one, or as many items or lines as asked.
    want <- if (n > 0L) n else if (nmax > 0L && !is.list(what)) nmax else -1L
    got <- character()
    repeat {
      l <- line()
      if (is.null(l) || !nzchar(l)) break
      got <- c(got, l)
      if (nlines > 0L && length(got) >= nlines) break
      if (want > 0L &&
          length(base::scan(text = got, what = what, sep = sep, ..., quiet = TRUE)) >= want) break
    }
    args <- list(text = got, what = what, sep = sep, ..., quiet = quiet)
    if (!missing(n)) args$n <- n
    if (!missing(nmax)) args$nmax <- nmax
    do.call(base::scan, args)
  }
  e$menu <- function(choices, graphics = FALSE, title = NULL) {
    nc <- length(choices)
    if (length(title) && nzchar(title[1L])) cat(title[1L], "\n")
    cat("", paste0(format(seq_len(nc)), ": ", choices), "", sep = "\n")
    repeat {
      cat("Selection: ")
      l <- line()
      if (is.null(l)) return(0L)
      l <- trimws(l)
      ind <- if (grepl("^[0-9]", l)) suppressWarnings(as.integer(sub("^([0-9]+).*", "\\1", l))) else match(l, choices)
      if (!is.na(ind) && ind <= nc) return(ind)
      cat("Enter an item from the menu, or 0 to exit\n")
    }
  }
  attach(e, name = "replbox:answers", warn.conflicts = FALSE)
})
