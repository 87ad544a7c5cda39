#!/usr/bin/env bash
# Submit tonight's batch: the cron entry point (docs/operations.md, scripts/crontab.example).
#
#   scripts/nightly.sh /etc/factory/nightly.yaml [BATCH-PREFIX]
#
# Harmless if cron fires twice: the batch name carries the date, so the second submission
# finds every job already there and creates (and dispatches) nothing; a lock keeps two
# runs from overlapping. Settings: the factory's one env file (/etc/factory/factory.env, or
# FACTORY_ENV_FILE; scripts/factory-env.sh): without it, or when it would submit to the
# embedded database or a local store on a host it says is production (FACTORY_PRODUCTION=1),
# nothing is submitted and the script exits 1 naming the file.
set -euo pipefail
manifest=${1:?usage: nightly.sh MANIFEST [BATCH-PREFIX]}
prefix=${2:-nightly}
here="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/factory-env.sh
. "$here/scripts/factory-env.sh"
load_factory_env submit
factory=${FACTORY_CLI:-$here/.venv/bin/factory}  # after the env file, as factory-cron reads it
batch="$prefix-$(date +%F)"
# The lock lives in FACTORY_HOME, which only the factory's user can write: in a shared temp
# directory another user could take the name first (a link to clobber, or a lock held for ever).
lock_dir=${FACTORY_HOME:-$HOME/.factory}
(umask 077 && mkdir -p "$lock_dir")
[ -O "$lock_dir" ] || { echo "$lock_dir is not owned by $(id -un); refusing to lock there" >&2; exit 1; }
exec 9>>"$lock_dir/nightly.lock"
flock -w 600 9 || { echo "another nightly submission is still running" >&2; exit 1; }
# This node's share of the batch's assets (audio beds) into its asset cache, and the prompt
# embeddings, so GPU workers never load the text encoder. Not fatal: a worker fetches a
# missing asset, or encodes a missing prompt, itself. Other nodes warm their share from
# their own cron entry (scripts/crontab.example).
echo "$(date -Is) warming the assets and prompts of $manifest"
"$factory" preload "$manifest" || echo "preload failed; workers will fetch and encode on demand" >&2
echo "$(date -Is) submitting $manifest as batch $batch"
"$factory" submit "$manifest" --batch "$batch"
"$factory" jobs --batch "$batch"
# Retention: the intermediates (lossless segments, chunks, work media) of jobs delivered
# longer ago than FACTORY_KEEP_INTERMEDIATES (7d) go; deliveries and QC reports stay. Not
# fatal: tonight's batch is submitted whatever gc says, and the next night retries.
echo "$(date -Is) removing the intermediates of delivered jobs past the retention policy"
"$factory" gc || echo "gc failed (exit $?); intermediates stay until the next run" >&2
