# shellcheck shell=bash
# The factory's one env file, for the cron scripts (nightly.sh, factory-cron, renew-crl); the
# systemd units read the same file (EnvironmentFile=, docker/systemd/). Sourced, not run.
#
#   FACTORY_ENV_FILE   the file (default /etc/factory/factory.env)
#
# One KEY=value a line, whole-line # comments: the format systemd and the shell read alike.
# A value with other characters than A-Z a-z 0-9 _ . / : @ , + = % - goes in single quotes
# (no ' or \ inside). Anything else (two assignments on a line, a comment after a value,
# double quotes, $) is refused with the line, since the two would read it differently.

FACTORY_ENV_FILE=${FACTORY_ENV_FILE:-/etc/factory/factory.env}

_env_refuse() {
  echo "$(basename "$0"): $FACTORY_ENV_FILE: $*; refusing to run (docs/configuration.md)" >&2
  exit 1
}

# Load the env file (every variable exported). With `submit`: also refuse, on a host whose
# file says FACTORY_PRODUCTION=1, what would put work where no worker looks: the embedded
# SQLite database, a local file store, no broker.
load_factory_env() {
  local plain='[A-Za-z0-9_./:@,+=%-]*' quoted="'[^'\\]*'" line n=0 bad=""
  local assignment="^[A-Za-z_][A-Za-z0-9_]*=($plain|$quoted)\$"
  [ -f "$FACTORY_ENV_FILE" ] || _env_refuse "no such file: the factory's settings are not here"
  [ -r "$FACTORY_ENV_FILE" ] || _env_refuse "not readable by $(id -un)"
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    [[ $line =~ ^[[:space:]]*(#.*)?$ || $line =~ $assignment ]] || bad+=" $FACTORY_ENV_FILE:$n"
  done < "$FACTORY_ENV_FILE"
  [ -z "$bad" ] || _env_refuse "systemd and the shell would read these lines differently:$bad" \
    "(one KEY=value a line, no comment after it, single quotes around other characters)"
  set -a
  # shellcheck disable=SC1090
  . "$FACTORY_ENV_FILE"
  set +a
  [ "${1:-}" = submit ] || return 0
  case "${FACTORY_PRODUCTION:-0}" in
    1|true|yes|on) ;;
    *) return 0 ;;
  esac
  case "${FACTORY_DATABASE_URL:-}" in
    ""|sqlite*) _env_refuse "FACTORY_PRODUCTION=1 but FACTORY_DATABASE_URL is" \
      "'${FACTORY_DATABASE_URL:-}': the batch would go to an embedded SQLite database no worker reads" ;;
  esac
  case "${FACTORY_STORE_URL:-}" in
    ""|file:*) _env_refuse "FACTORY_PRODUCTION=1 but FACTORY_STORE_URL is" \
      "'${FACTORY_STORE_URL:-}': assets would go to a local folder no other node sees" ;;
  esac
  [ -n "${FACTORY_BROKER_URL:-}" ] || _env_refuse "FACTORY_PRODUCTION=1 but FACTORY_BROKER_URL" \
    "is empty: nothing would send the batch to the workers"
}
