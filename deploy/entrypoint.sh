#!/usr/bin/env bash
# The replica container's entrypoint (deploy/Dockerfile; docs/deploy.md). Serves one model
# on 0.0.0.0:$LOUPE_PORT with the arguments given (e.g. --max-seqs 16):
#   LOUPE_MODEL=/models/x.gguf        a mounted GGUF file or Hugging Face directory, or
#   LOUPE_FETCH_MODEL=smollm2         a model of `loupe fetch-model`'s catalog, fetched into
#                                     $LOUPE_CACHE_DIR at start (nothing when already there).
# `/health` answers 503 while the model loads and 200 once it serves, which is what the
# readiness probe reads. loupe replaces this script (exec), so the container's SIGTERM reaches
# it: in-flight requests drain within --shutdown-timeout, streams still running then end
# with an error event, and it exits 0.
set -euo pipefail

model="${LOUPE_MODEL:-}"
if [ -z "$model" ]; then
    if [ -z "${LOUPE_FETCH_MODEL:-}" ]; then
        echo "loupe-entrypoint: error: set LOUPE_MODEL (a mounted model path) or LOUPE_FETCH_MODEL (a name from 'loupe fetch-model --help')" >&2
        exit 2
    fi
    echo "loupe-entrypoint: fetching ${LOUPE_FETCH_MODEL} into ${LOUPE_CACHE_DIR:-the cache}" >&2
    model="$(loupe fetch-model "$LOUPE_FETCH_MODEL")"
fi
if [ ! -e "$model" ]; then
    echo "loupe-entrypoint: error: the model $model does not exist (is its volume mounted?)" >&2
    exit 2
fi
exec loupe serve --model "$model" --host "${LOUPE_HOST:-0.0.0.0}" --port "${LOUPE_PORT:-8000}" "$@"
