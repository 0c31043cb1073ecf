#!/bin/sh
# A stand-in for RunPod's basic SSH proxy, used as sshd's ForceCommand in the tests.
#
# Like the real one it offers nothing but an interactive shell on a terminal: a session
# without a PTY is refused with the message VS Code users know, a command (exec request)
# is refused even with a PTY, and there is no SFTP subsystem (sshd_config has none).
# What is left gets a banner, a MOTD and a login shell with a coloured prompt: the noise
# gpuws must get past before its first frame.
#
# Knobs (sshd's SetEnv): GPUWS_PTY_SHELL=bash|sh, GPUWS_PTY_HOME (the shell's HOME, whose
# .bash_profile sets the prompt), GPUWS_PTY_NOISE=SECONDS (a background job writes a
# line to the terminal that often, as `wall` or a chatty job would), GPUWS_PTY_PATH (the
# login shell's PATH, e.g. one without python3).

if [ ! -t 0 ] || [ ! -t 1 ]; then
    echo "Error: Your SSH client doesn't support PTY"
    exit 1
fi
if [ -n "${SSH_ORIGINAL_COMMAND:-}" ]; then
    echo "Error: this proxy only opens interactive shells; commands are not supported"
    exit 1
fi

printf '\033[1;35m'
cat <<'EOF'
 ______                 ______           _
|  ___ \               |  ___ \         | |
| |___) ) _   _  ____  | |___) )  ___   | |  _
|  __  / | | | ||  _ \ |  ____/  / _ \  | | / )
| |  \ \ | |_| || | | || |      | |_| | | |< (
|_|   \_\ \____||_| |_||_|       \___/  |_| \_)
EOF
printf '\033[0m'
echo "Welcome to pod-7f3a (Ubuntu 22.04.4 LTS, GNU/Linux x86_64)"
echo "  * GPU: 1 x NVIDIA H200 · container disk 50 GB · \$3.59/hr"
echo ""

if [ -n "${GPUWS_PTY_HOME:-}" ]; then
    HOME=$GPUWS_PTY_HOME
    export HOME
    cd "$HOME" || exit 1
fi

if [ -n "${GPUWS_PTY_NOISE:-}" ]; then
    # Stops by itself once the terminal is gone (the write fails).
    ( while sleep "$GPUWS_PTY_NOISE"; do
          printf '\r\nBroadcast message from root@pod-7f3a: noise %s\r\n' "$$" || exit 0
      done ) &
fi

PS1='root@pod-7f3a:~# '
export PS1
if [ "${GPUWS_PTY_SHELL:-bash}" = "sh" ]; then
    [ -n "${GPUWS_PTY_PATH:-}" ] && PATH=$GPUWS_PTY_PATH && export PATH
    exec sh -i
fi
exec bash -il
