# replbox: what the session gave its cells that a notebook or a script does not, so that
# they run again as they ran there: the answers typed at their prompts, which the cells'
# `read` (its -p prompt shown, as at a terminal), `mapfile` and `readarray` get, in order.
# Bash's own standard input is left alone: it may be where bash reads this script from.
exec {_rbx_answers}< <(printf '%s' {answers:shell})
read() {
  local OPTIND=1 OPTARG _rbx_o
  while getopts ':a:d:ei:n:N:p:rst:u:' _rbx_o; do
    if [[ $_rbx_o == p ]]; then printf '%s' "$OPTARG" >&2; fi
  done
  builtin read "$@" <&"$_rbx_answers"
}
mapfile() { builtin mapfile "$@" <&"$_rbx_answers"; }
readarray() { builtin readarray "$@" <&"$_rbx_answers"; }
