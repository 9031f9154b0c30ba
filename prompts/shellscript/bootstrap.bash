# replbox's bootstrap for an interactive bash, read as its rc file (see
# docs/bootstrap-protocol.md). Before writing it into the session's control directory,
# replbox replaces the placeholders below, marked `:shell`, by $'...' strings.
set +o history
unset HISTFILE PROMPT_COMMAND PS0
set +m
declare -r __rbx_c={ctl:shell} __rbx_n={nonce:shell} __rbx_cell={cell_file:shell}
__rbx_status=0
PS1={prompt:shell}
PS2={continuation:shell}
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
__rbx_load() {
  local s=$__rbx_status
  { builtin printf '\e_rbx;%s;s;%s\e\\' "$__rbx_n" "$1" > /dev/tty; } 2> /dev/null || builtin printf '\e_rbx;%s;s;%s\e\\' "$__rbx_n" "$1"
  __rbx_code=
  IFS= builtin read -r -d '' __rbx_code < "$__rbx_c/${__rbx_cell/"{n}"/$1}" || :
  # Under `set -e` a non-zero status here (and in __rbx_end) would end the shell.
  [[ $- == *e* ]] && return 0
  return "$s"
}
__rbx_end() {
  __rbx_status=$2
  unset __rbx_code
  local m p
  if (($2 == 0)); then
    builtin printf -v m '\e_rbx;%s;e;%s;ok;\e\\' "$__rbx_n" "$1"
  else
    __rbx_b64 "{\"type\":\"exit_status\",\"message\":\"$2\"}" p
    builtin printf -v m '\e_rbx;%s;e;%s;error;%s\e\\' "$__rbx_n" "$1" "$p"
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
