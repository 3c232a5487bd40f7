#!/usr/bin/env bash
# Install the bpuemu board (hrt_boardd + hrt_model_exec) on a Debian or Ubuntu
# machine, meant for an aarch64 board. Run as root. Safe to run again: it
# upgrades the package and keeps the existing settings, token and models.
#
#   install.sh [OPTIONS] [PACKAGE]
#
# PACKAGE is a wheel, an sdist, a source directory, or a PyPI requirement
# (default: bpuemu). Only the board's dependencies are installed (numpy,
# onnxruntime, grpcio, ...), never the [host] extra.
#
# What it sets up:
#   /opt/bpuemu/venv              the venv (hrt_boardd, hrt_model_exec; linked into /usr/local/bin)
#   /var/lib/bpuemu/models        the model store (/userdata/bpuemu/models when /userdata exists)
#   /etc/bpuemu/hrt_boardd.conf   settings: listen address, token file, model store, limits
#   /etc/bpuemu/token             the board's token, generated when missing (0600, owned by the service user)
#   bpuemu                        a system user the daemon runs as
#   hrt_boardd.service            the systemd unit (next to this script), enabled and (re)started
#
# Options:
#   --prefix DIR           install root; the venv is DIR/venv          (default /opt/bpuemu)
#   --store DIR            model store                                  (default see above)
#   --config FILE          settings file                                (default /etc/bpuemu/hrt_boardd.conf)
#   --token-file FILE      token file                                   (default /etc/bpuemu/token)
#   --listen HOST:PORT     where hrt_boardd listens                     (default 0.0.0.0:9473)
#   --user NAME            service user                                 (default bpuemu)
#   --max-model-mb N  --max-jobs N  --max-frame-count N  --max-perf-time MINUTES
#                          limits written to the settings file
#   --python PYTHON        interpreter for the venv (>= 3.9)            (default python3)
#   --pip-arg ARG          pass ARG to pip (repeatable), e.g. --pip-arg=--index-url=URL
#   --no-systemd           do not call systemctl (chroots, containers, no systemd); the
#                          unit file is still installed and the command to start the
#                          daemon in the foreground is printed
#   --no-start             enable the unit but do not (re)start it
#   -h, --help
#
# Settings given as options are written into an existing settings file; all
# other settings in it are left as they are.
set -euo pipefail
umask 022

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
UNIT_NAME=hrt_boardd.service
UNIT_SRC="$SCRIPT_DIR/$UNIT_NAME"
UNIT_DIR=/etc/systemd/system
DEFAULT_PREFIX=/opt/bpuemu
DEFAULT_USER=bpuemu
DEFAULT_LISTEN=0.0.0.0:9473

prefix=$DEFAULT_PREFIX
config=/etc/bpuemu/hrt_boardd.conf
user=$DEFAULT_USER
python=python3
package=bpuemu
use_systemd=1
start=1
pip_args=()
declare -A given=()   # settings given on the command line: conf key -> value

say() { echo "install.sh: $*"; }
die() { echo "install.sh: error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
positive_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, not '$2'"; }

while [ $# -gt 0 ]; do
    arg="$1"
    value=""
    case "$arg" in
        --*=*) value="${arg#*=}"; arg="${arg%%=*}"; set -- "$arg" "$value" "${@:2}" ;;
    esac
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        --prefix) need_value "$@"; prefix="$2"; shift 2 ;;
        --store) need_value "$@"; given[HRT_BOARDD_MODEL_DIR]="$2"; shift 2 ;;
        --config) need_value "$@"; config="$2"; shift 2 ;;
        --token-file) need_value "$@"; given[HRT_BOARDD_TOKEN_FILE]="$2"; shift 2 ;;
        --listen) need_value "$@"; given[HRT_BOARDD_LISTEN]="$2"; shift 2 ;;
        --user) need_value "$@"; user="$2"; shift 2 ;;
        --max-model-mb) need_value "$@"; positive_int "$@"; given[HRT_BOARDD_MAX_MODEL_MB]="$2"; shift 2 ;;
        --max-jobs) need_value "$@"; positive_int "$@"; given[HRT_BOARDD_MAX_JOBS]="$2"; shift 2 ;;
        --max-frame-count) need_value "$@"; positive_int "$@"; given[HRT_BOARDD_MAX_FRAME_COUNT]="$2"; shift 2 ;;
        --max-perf-time)
            need_value "$@"
            [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] && [[ ! "$2" =~ ^0+(\.0+)?$ ]] || die "--max-perf-time must be a positive number of minutes, not '$2'"
            given[HRT_BOARDD_MAX_PERF_TIME]="$2"; shift 2 ;;
        --python) need_value "$@"; python="$2"; shift 2 ;;
        --pip-arg) need_value "$@"; pip_args+=("$2"); shift 2 ;;
        --no-systemd) use_systemd=0; shift ;;
        --no-start) start=0; shift ;;
        --) shift; break ;;
        -*) die "unknown option $arg (see --help)" ;;
        *) package="$1"; shift ;;
    esac
done
[ $# -le 1 ] || die "one PACKAGE at most (got: $*)"
[ $# -eq 0 ] || package="$1"

for key in "${!given[@]}"; do
    case "${given[$key]}" in
        *[[:space:]\"\'\$\\]*) die "${given[$key]}: settings cannot contain spaces, quotes, \$ or backslashes" ;;
    esac
done
case "$prefix$config$user" in *[[:space:]]*) die "--prefix, --config and --user cannot contain spaces" ;; esac

[ "$(id -u)" = 0 ] || die "run as root (it creates a user, /opt, /etc and /var/lib entries)"
machine="$(uname -m)"
[ "$machine" = aarch64 ] || say "note: this machine is $machine, not aarch64; installing anyway"

venv="$prefix/venv"
etc_dir="$(dirname "$config")"
"$python" - <<'EOF' || die "$python is missing or older than 3.9 (Debian/Ubuntu: apt-get install python3 python3-venv)"
import sys
sys.exit(0 if sys.version_info >= (3, 9) else 1)
EOF

# --- the settings file ------------------------------------------------------

conf_get() {  # conf_get KEY: its value in the settings file ("" when absent)
    [ -f "$config" ] || return 0
    sed -n "s/^[[:space:]]*$1=//p" "$config" | tail -n 1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}

conf_set() {  # conf_set KEY VALUE: replace the key's line, or append one
    local tmp
    tmp="$(mktemp "$config.XXXXXX")"
    awk -v key="$1" -v value="$2" '
        $0 ~ "^[[:space:]]*" key "=" { if (!done) print key "=" value; done = 1; next }
        { print }
        END { if (!done) print key "=" value }' "$config" >"$tmp"
    chmod 0640 "$tmp"
    mv "$tmp" "$config"
}

own_dir() {  # own_dir MODE USER GROUP DIR: create DIR (parents with default modes), set its mode and owner
    mkdir -p "$(dirname "$4")"
    install -d -m "$1" -o "$2" -g "$3" "$4"
}

not_a_system_dir() {  # refuse to take over a directory the system owns
    case "${1%/}" in
        ""|/|/bin|/boot|/dev|/etc|/home|/lib|/lib64|/opt|/proc|/root|/run|/sbin|/srv|/sys|/tmp|/usr|/usr/*bin|/usr/lib|/usr/local|/var|/var/lib|/var/tmp|/userdata)
            die "$2 $1 is a system directory; give a directory of its own (e.g. $1/bpuemu)" ;;
    esac
}

default_store() {
    if [ -d /userdata ]; then echo /userdata/bpuemu/models; else echo /var/lib/bpuemu/models; fi
}

write_config() {
    local store="${given[HRT_BOARDD_MODEL_DIR]:-$(default_store)}"
    local tmp
    tmp="$(mktemp "$config.XXXXXX")"
    cat >"$tmp" <<EOF
# hrt_boardd settings (bpuemu board daemon), read by hrt_boardd.service as its
# EnvironmentFile. KEY=VALUE lines, no spaces or quotes in values. Restart the
# daemon after a change: systemctl restart hrt_boardd

# Where to listen. Beyond loopback, hrt_boardd requires the token below.
HRT_BOARDD_LISTEN=${given[HRT_BOARDD_LISTEN]:-$DEFAULT_LISTEN}
# The token callers present (hrt_model_exec/hb_verifier --token-file, or BPUEMU_TOKEN).
HRT_BOARDD_TOKEN_FILE=${given[HRT_BOARDD_TOKEN_FILE]:-$etc_dir/token}
# Uploaded models, kept by SHA-256.
HRT_BOARDD_MODEL_DIR=$store

# Limits: largest model upload (MiB), infer/perf calls at once, frame_count and
# perf_time (minutes) caps. A call over a limit fails with RESOURCE_EXHAUSTED.
HRT_BOARDD_MAX_MODEL_MB=${given[HRT_BOARDD_MAX_MODEL_MB]:-1024}
HRT_BOARDD_MAX_JOBS=${given[HRT_BOARDD_MAX_JOBS]:-4}
HRT_BOARDD_MAX_FRAME_COUNT=${given[HRT_BOARDD_MAX_FRAME_COUNT]:-1000000}
HRT_BOARDD_MAX_PERF_TIME=${given[HRT_BOARDD_MAX_PERF_TIME]:-60}

HRT_BOARDD_LOG_LEVEL=INFO
# More hrt_boardd flags, split on spaces (see hrt_boardd --help), e.g. --metrics-listen 127.0.0.1:9474.
HRT_BOARDD_EXTRA_ARGS=
EOF
    chmod 0640 "$tmp"
    mv "$tmp" "$config"
}

# --- 1. the service user ----------------------------------------------------

if ! getent passwd "$user" >/dev/null; then
    home="/var/lib/$user"  # /var/lib/bpuemu for the default user
    if getent group "$user" >/dev/null; then
        useradd --system --gid "$user" --home-dir "$home" --no-create-home --shell /usr/sbin/nologin "$user"
    else
        useradd --system --user-group --home-dir "$home" --no-create-home --shell /usr/sbin/nologin "$user"
    fi
    say "created system user $user"
fi
group="$(id -gn "$user")"
home="$(getent passwd "$user" | cut -d: -f6)"

# --- 2. settings ------------------------------------------------------------

if [ "$etc_dir" = /etc/bpuemu ] || [ ! -d "$etc_dir" ]; then
    own_dir 0750 root "$group" "$etc_dir"
fi
if [ -f "$config" ]; then
    for key in "${!given[@]}"; do
        if [ "$(conf_get "$key")" != "${given[$key]}" ]; then
            conf_set "$key" "${given[$key]}"
            say "set $key=${given[$key]} in $config"
        fi
    done
    say "kept the settings in $config"
else
    write_config
    say "wrote $config"
fi
chown root:"$group" "$config"
chmod 0640 "$config"

listen="$(conf_get HRT_BOARDD_LISTEN)"
token_file="$(conf_get HRT_BOARDD_TOKEN_FILE)"
store="$(conf_get HRT_BOARDD_MODEL_DIR)"
for key in HRT_BOARDD_LISTEN HRT_BOARDD_TOKEN_FILE HRT_BOARDD_MODEL_DIR HRT_BOARDD_MAX_MODEL_MB HRT_BOARDD_MAX_JOBS \
           HRT_BOARDD_MAX_FRAME_COUNT HRT_BOARDD_MAX_PERF_TIME HRT_BOARDD_LOG_LEVEL; do
    [ -n "$(conf_get "$key")" ] || die "$config sets no $key (delete the file to get a fresh one)"
done

# --- 3. model store and token -----------------------------------------------

not_a_system_dir "$store" "the model store"
case "$store" in /*) ;; *) die "the model store must be an absolute path, not $store" ;; esac
case "$token_file" in /*) ;; *) die "the token file must be an absolute path, not $token_file" ;; esac
# The service user's HOME when it is a state dir (onnxruntime keeps a small file there), then the store.
if [ "$home" = "/var/lib/$user" ]; then
    own_dir 0750 "$user" "$group" "$home"
fi
case "$(dirname "$store")" in
    /userdata/bpuemu) own_dir 0750 "$user" "$group" /userdata/bpuemu ;;
esac
own_dir 0750 "$user" "$group" "$store"

token_dir="$(dirname "$token_file")"
if [ ! -d "$token_dir" ]; then
    own_dir 0750 root "$group" "$token_dir"
fi
if [ ! -s "$token_file" ]; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token_file")
    [ "$(wc -c <"$token_file")" -eq 64 ] || die "could not generate a token into $token_file"
    say "generated a new token in $token_file"
fi
chown "$user:$group" "$token_file"
chmod 0600 "$token_file"
[ "$(tr -d '[:space:]' <"$token_file" | wc -c)" -ge 16 ] || die "the token in $token_file is shorter than 16 characters"

# --- 4. the venv and the board package --------------------------------------

if [ -e "$venv" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    say "the venv in $venv is broken (Python upgraded? an interrupted install?): recreating it"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -c "import ensurepip, venv" 2>/dev/null; then
        if command -v apt-get >/dev/null; then
            say "installing python3-venv"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        else
            die "$python has no venv/ensurepip module (install python3-venv)"
        fi
    fi
    not_a_system_dir "$prefix" "--prefix"
    install -d -m 0755 "$prefix"
    "$python" -m venv "$venv"
    say "created the venv $venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
say "installing $package into $venv"
if [ -e "$package" ]; then
    # A local wheel, sdist or tree. Over an installed bpuemu, replace it first even
    # at the same version (a rebuilt artifact), then bring in any new dependencies.
    if "${pip[@]}" show --quiet bpuemu >/dev/null 2>&1; then
        "${pip[@]}" install ${pip_args[@]+"${pip_args[@]}"} --no-deps --force-reinstall "$package"
    fi
    "${pip[@]}" install ${pip_args[@]+"${pip_args[@]}"} "$package"
else
    "${pip[@]}" install ${pip_args[@]+"${pip_args[@]}"} --upgrade "$package"
fi
version="$("$venv/bin/hrt_boardd" --version)" || die "hrt_boardd does not run from $venv"
say "installed: $version"
for tool in hrt_boardd hrt_model_exec; do
    ln -sfn "$venv/bin/$tool" "/usr/local/bin/$tool"
done

# --- 5. the systemd unit ----------------------------------------------------

[ -f "$UNIT_SRC" ] || die "$UNIT_SRC is missing (keep install.sh next to $UNIT_NAME)"
install -d -m 0755 "$UNIT_DIR"
install -m 0644 "$UNIT_SRC" "$UNIT_DIR/$UNIT_NAME"
dropin_dir="$UNIT_DIR/$UNIT_NAME.d"
dropin="$dropin_dir/10-install.conf"
dropin_text=""
if [ "$prefix" != "$DEFAULT_PREFIX" ]; then
    # Same command line as the unit's, from this prefix.
    exec_start="$(sed -n 's/^ExecStart=//p' "$UNIT_SRC" | sed "s#^$DEFAULT_PREFIX/#$prefix/#")"
    dropin_text+=$'ExecStart=\n'"ExecStart=$exec_start"$'\n'
fi
if [ "$user" != "$DEFAULT_USER" ]; then
    dropin_text+="User=$user"$'\n'"Group=$group"$'\n'
    case "$home" in
        /var/lib/bpuemu|/var/lib/bpuemu/*) ;;
        "/var/lib/$user") dropin_text+="ReadWritePaths=-$home"$'\n' ;;
    esac
fi
if [ "$config" != /etc/bpuemu/hrt_boardd.conf ]; then
    dropin_text+=$'EnvironmentFile=\n'"EnvironmentFile=$config"$'\n'
fi
case "$store" in
    /var/lib/bpuemu|/var/lib/bpuemu/*|/userdata/bpuemu|/userdata/bpuemu/*) ;;
    *) dropin_text+="ReadWritePaths=$store"$'\n' ;;
esac
if [ -n "$dropin_text" ]; then
    install -d -m 0755 "$dropin_dir"
    printf '# Written by install.sh for this installation.\n[Service]\n%s' "$dropin_text" >"$dropin"
    chmod 0644 "$dropin"
    say "wrote $dropin"
elif [ -f "$dropin" ]; then
    rm -f "$dropin"
    rmdir "$dropin_dir" 2>/dev/null || true
fi

host_port="${listen##*:}"
probe_host="${listen%:*}"
case "$probe_host" in 0.0.0.0|"[::]"|::|"") probe_host=127.0.0.1 ;; esac
probe="$venv/bin/python -m bpuemu.board.daemon.healthcheck --target $probe_host:$host_port"

if [ "$use_systemd" = 1 ] && { ! command -v systemctl >/dev/null || [ ! -d /run/systemd/system ]; }; then
    say "systemd is not running here: not enabling the service (as with --no-systemd)"
    use_systemd=0
fi
if [ "$use_systemd" = 1 ]; then
    systemctl daemon-reload
    systemctl enable --quiet "$UNIT_NAME"
    if [ "$start" = 1 ]; then
        systemctl restart "$UNIT_NAME"
        if conf_get HRT_BOARDD_EXTRA_ARGS | grep -q -- "--tls-cert"; then
            # With TLS on, the probe would need a CA this script does not know: settle for systemd's view.
            sleep 5
            systemctl is-active --quiet "$UNIT_NAME" || { systemctl status --no-pager "$UNIT_NAME" >&2 || true; die "hrt_boardd did not start; journalctl -u hrt_boardd"; }
        else
            for _ in $(seq 1 60); do
                if $probe --quiet 2>/dev/null; then break; fi
                sleep 1
            done
            $probe || { systemctl status --no-pager "$UNIT_NAME" >&2 || true; die "hrt_boardd did not become healthy; journalctl -u hrt_boardd"; }
        fi
    fi
    run_hint="systemctl status hrt_boardd; journalctl -u hrt_boardd"
else
    run_hint="start it in the foreground as $user:
    set -a; . $config; set +a
    setpriv --reuid=$user --regid=$group --init-groups $venv/bin/hrt_boardd --listen \"\$HRT_BOARDD_LISTEN\" --model-dir \"\$HRT_BOARDD_MODEL_DIR\" --token-file \"\$HRT_BOARDD_TOKEN_FILE\" --max-model-mb \"\$HRT_BOARDD_MAX_MODEL_MB\" --max-jobs \"\$HRT_BOARDD_MAX_JOBS\" --max-frame-count \"\$HRT_BOARDD_MAX_FRAME_COUNT\" --max-perf-time \"\$HRT_BOARDD_MAX_PERF_TIME\" --log-level \"\$HRT_BOARDD_LOG_LEVEL\" \$HRT_BOARDD_EXTRA_ARGS"
fi

cat <<EOF
install.sh: done.
  venv      $venv ($version)
  settings  $config (listen $listen)
  models    $store
  token     $token_file (copy it to the host; pass it with --token-file)
  health    $probe
  daemon    $run_hint
EOF
