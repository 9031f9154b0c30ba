# replbox's bootstrap for an interactive bash, read as its rc file (see
# docs/bootstrap-protocol.md). Before writing it into the session's control directory,
# replbox replaces the placeholders below, marked `:shell`, by $'...' strings.
set +o history
unset HISTFILE PROMPT_COMMAND PS0
set +m
declare -r __rbx_c={ctl:shell} __rbx_n={nonce:shell} __rbx_cell={cell_file:shell} \
  __rbx_in={input_file:shell} __rbx_p1={prompt:shell} __rbx_p2={continuation:shell}
__rbx_status=0
# The prompts are ours between cells (replbox recognises them) and the user's while a cell
# runs: `PS1='>>> '` or `source venv/bin/activate` set them for the cell, never printed.
# __rbx_u holds the user's PS1, PS2, PS0 and PROMPT_COMMAND while ours are in place, and
# whether PS0 was set at all (bash starts without one: a PS0 the user never set is not
# theirs to see in session_vars).
__rbx_u=('\s-\v\$ ' '> ' '' '' '')
PS1=$__rbx_p1
PS2=$__rbx_p2
# Run before every prompt, also the one after Ctrl-C, when the cell's end was skipped. An
# element of its own, so that `PROMPT_COMMAND=...` (element 0) keeps it.
PROMPT_COMMAND=([9]='{ __rbx_own; } 2> /dev/null')
# An interrupt can stop either function anywhere: PS1 is set last by __rbx_give and first
# by __rbx_own, and says whose prompts are in place.
__rbx_own() {
  [[ ${PS1-} == "$__rbx_p1" ]] && return 0
  __rbx_u=("${PS1-}" "${PS2-}" "${PS0-}" "${PROMPT_COMMAND[0]-}" "${PS0+set}")
  PS1=$__rbx_p1
  PS2=$__rbx_p2
  unset PS0 'PROMPT_COMMAND[0]'
}
__rbx_give() {
  [[ ${PS1-} != "$__rbx_p1" ]] && return 0
  PROMPT_COMMAND[0]=${__rbx_u[3]}
  PS2=${__rbx_u[1]}
  if [[ -n ${__rbx_u[4]} ]]; then PS0=${__rbx_u[2]}; else unset PS0; fi
  PS1=${__rbx_u[0]}
}
# __rbx_b64 STRING VAR: VAR = base64 of the ASCII STRING (no external program: the code
# may have changed PATH).
__rbx_b64() {
  local s=$1 t=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/ out= i a b c n
  for ((i = 0; i < ${#s}; i += 3)); do
    builtin printf -v a '%d' "'${s:i:1}"
    b=0 c=0
    ((i + 1 < ${#s})) && builtin printf -v b '%d' "'${s:i+1:1}"
    ((i + 2 < ${#s})) && builtin printf -v c '%d' "'${s:i+2:1}"
    n=$(( (a << 16) | (b << 8) | c ))
    out+=${t:n>>18&63:1}${t:n>>12&63:1}
    if ((i + 1 < ${#s})); then out+=${t:n>>6&63:1}; else out+='='; fi
    if ((i + 2 < ${#s})); then out+=${t:n&63:1}; else out+='='; fi
  done
  builtin printf -v "$2" '%s' "$out"
}
# Tracing (set -x) and echoing input (set -v) are turned off around the cell, so that they
# show the cell's commands and never these functions (which run with stderr on /dev/null).
__rbx_x=
__rbx_v=
__rbx_load() {
  local s=$__rbx_status
  [[ $- == *x* ]] && { set +x; __rbx_x=1; }
  [[ $- == *v* ]] && { set +v; __rbx_v=1; }
  { builtin printf '\e_rbx;%s;s;%s\e\\' "$__rbx_n" "$1" > /dev/tty; } 2> /dev/null || builtin printf '\e_rbx;%s;s;%s\e\\' "$__rbx_n" "$1"
  __rbx_give
  # Not the read builtin: interrupted, it keeps what it had buffered of the file and hands
  # that to its next read, the next cell's.
  __rbx_code=$(< "$__rbx_c/${__rbx_cell/"{n}"/$1}") || :
  # xtrace would show `eval` itself: the code turns it on (its first line stays line 1);
  # verbose shows the code as eval reads it.
  [[ -n $__rbx_x ]] && __rbx_code="set -x; $__rbx_code"
  [[ -n $__rbx_v ]] && set -v
  __rbx_x= __rbx_v=
  # Under `set -e` a non-zero status here (and in __rbx_end) would end the shell.
  [[ $- == *e* ]] && return 0
  return "$s"
}
# Input typed into the cell (replbox says so with a file) that the program did not read
# would be the shell's next line: read it out of the terminal (with -n the terminal leaves
# line mode, so a line without Enter comes too) and count its bytes.
__rbx_unread() {
  local LC_ALL=C u=
  IFS= builtin read -r -d '' -n 16777216 -t 0.02 u
  __rbx_count=${#u}
}
__rbx_end() {
  __rbx_status=$2
  [[ $- == *x* ]] && { set +x; __rbx_x=1; }
  [[ $- == *v* ]] && { set +v; __rbx_v=1; }
  __rbx_own
  unset __rbx_code
  local m p j=
  __rbx_count=0
  [[ -e $__rbx_c/${__rbx_in/"{n}"/$1} ]] && __rbx_unread
  (($2 != 0)) && j="\"type\":\"exit_status\",\"message\":\"$2\""
  ((__rbx_count > 0)) && j+="${j:+,}\"unread\":$__rbx_count"
  if [[ -z $j ]]; then
    builtin printf -v m '\e_rbx;%s;e;%s;ok;\e\\' "$__rbx_n" "$1"
  else
    __rbx_b64 "{$j}" p
    if (($2 == 0)); then
      builtin printf -v m '\e_rbx;%s;e;%s;ok;%s\e\\' "$__rbx_n" "$1" "$p"
    else
      builtin printf -v m '\e_rbx;%s;e;%s;error;%s\e\\' "$__rbx_n" "$1" "$p"
    fi
  fi
  { builtin printf '%s' "$m" > /dev/tty; } 2> /dev/null || builtin printf '%s' "$m"
  [[ $- == *e* ]] && return 0
  return "$2"
}
# session_vars: the variables and functions the user defined (not those there at start:
# the environment's and bash's own), one per line, `name<TAB>type<TAB>summary`, read by
# the language's vars_pattern.
__rbx_vars() {
  local n t v d
  for n in $(compgen -v); do
    [[ -n ${__rbx_known[$n]+x} || $n == __rbx* || $n == _ ]] && continue
    # bash's own, which it sets later (in a function, after the rc file, on cd, on resize)
    [[ $n == BASH* || $n == FUNCNAME || $n == HIST* || $n == COMP* || $n == COLUMNS || $n == LINES || $n == OLDPWD || $n == PIPESTATUS ]] && continue
    d=$(declare -p "$n" 2> /dev/null) || continue
    case ${d#declare -} in
      *A*' '*) t=associative_array; eval "v=\"\${#$n[@]} keys\"" ;;
      a*' '* | ?a*' '*) t=array; eval "v=\"\${#$n[@]} elements\"" ;;
      *i*' '*) t=integer; v=${!n} ;;
      *) t=string; v=${!n}; v="length ${#v}: ${v:0:80}" ;;
    esac
    v=${v//[$'\t\n\r']/ }
    builtin printf '%s\t%s\t%s\n' "$n" "$t" "$v"
  done
  while read -r _ _ n; do
    [[ -n ${__rbx_known_f[$n]+x} || $n == __rbx* ]] && continue
    builtin printf '%s\t%s\t%s\n' "$n" function ""
  done < <(declare -F)
}
declare -A __rbx_known __rbx_known_f
for __rbx_v in $(compgen -v) __rbx_v; do __rbx_known[$__rbx_v]=1; done
while read -r _ _ __rbx_v; do __rbx_known_f[$__rbx_v]=1; done < <(declare -F)
unset __rbx_v
