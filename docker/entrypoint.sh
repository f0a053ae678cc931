#!/bin/sh
# Entrypoint of the mistk-rl image: `mistk-rl ARGS...` as an unprivileged user.
#
# Why it starts as root: docker creates a missing bind-mount source (./runs in a fresh clone)
# owned by root, so a container that starts as an unprivileged user cannot write its results
# or its --data-dir there. Started as root, this script hands each writable directory the
# container uses (MISTK_RL_DIRS, default /runs and /data) to the user the service will run as,
# then drops to that user with setpriv (util-linux, in every Debian image) and execs
# mistk-rl, so the service is PID 1 and never runs as root.
#
# The user: MISTK_RL_UID / MISTK_RL_GID when set (e.g. your own `id -u` / `id -g`, so the files
# on the host are yours); else the owner of the first of those directories that exists and is
# not owned by root (an ./runs you made yourself); else 1000:1000, the image's `mistk` user.
# Only those directories themselves are chowned, never what is already inside them.
# Started as non-root (`docker run --user ...`), it execs mistk-rl as that user unchanged.
set -eu

[ "$(id -u)" = 0 ] || exec mistk-rl "$@"

dirs=${MISTK_RL_DIRS:-/runs /data}
uid=${MISTK_RL_UID:-}
gid=${MISTK_RL_GID:-}
if [ -z "$uid" ]; then
    for dir in $dirs; do
        owner=$(stat -c %u:%g "$dir" 2>/dev/null) || continue
        case $owner in 0:*) continue ;; esac
        uid=${owner%%:*}
        gid=${gid:-${owner#*:}}
        break
    done
fi
uid=${uid:-1000}
gid=${gid:-$uid}

for dir in $dirs; do
    mkdir -p "$dir"
    [ "$(stat -c %u:%g "$dir")" = "$uid:$gid" ] || chown "$uid:$gid" "$dir"
done

# a home the user can write (matplotlib's and torch's caches); the mistk user has its own
if [ "$uid" != "$(id -u mistk 2>/dev/null)" ]; then
    export HOME=/tmp/home
    mkdir -p "$HOME" && chown "$uid:$gid" "$HOME"
else
    export HOME=/home/mistk
fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- mistk-rl "$@"
