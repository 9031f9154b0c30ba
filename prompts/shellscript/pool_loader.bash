# replbox warm pool: bash. This shell was started ahead of time. It waits on stdin for one
# request, then becomes the program as `bash main.sh ARGS` starts: the same executable run
# afresh (exec, so in this process) with the run's command line and environment, in order.
__rbx_pool() {
    local LC_ALL=C len got=0 v i t=5 pwd='' haspwd=0
    local -a a=() envs=() start=()
    # Whether the sandbox gave this process PWD (bwrap does, replacing or appending it): the
    # program gets it the same way.
    mapfile -d '' start < /proc/$$/environ
    for v in "${start[@]}"; do
        [[ $v == PWD=* ]] && haspwd=1 pwd=${v#PWD=}
    done
    # The pool let this one go unused when stdin ends early.
    IFS= read -r len || exit 0
    for ((i = 0; i < t; i++)); do
        # Fields are NUL-separated; the last one ends where the request does.
        if ((i > 4 && i == t - 1)); then
            IFS= read -r -N $((len - got)) v || exit 0
        else
            IFS= read -r -d '' v || exit 0
        fi
        got=$((got + ${#v} + 1))
        a+=("$v")
        ((i == 4)) && t=$((5 + a[3] + a[4]))
    done
    # As the helper sets it for a cold run: SIGXCPU at the limit, SIGKILL a second later.
    ulimit -S -t "${a[1]}" && ulimit -H -t $((a[1] + 1)) || exit 125
    envs=("${a[@]:5+a[3]}")
    if ((haspwd)); then
        for i in "${!envs[@]}"; do
            [[ ${envs[i]} == PWD=* ]] && envs[i]=PWD=$pwd && haspwd=0
        done
        ((haspwd)) && envs+=("PWD=$pwd")
    fi
    exec /usr/bin/env -i -- "${envs[@]}" "${a[@]:5:a[3]}"
}
__rbx_pool
