"""Prefix caches on disk: saved when a model unloads, restored when it loads.

Layout, under the manager's cache dir::

    prefix/
      .locks/<fingerprint>.lock        one flock per folder (never deleted)
      .locks/bound.lock                held while a daemon bounds the whole dir
      <fingerprint>/
        manifest.json                  the entries, most recently used first
        <sha256 of the tokens>.safetensors   one entry: KV arrays + token ids

The fingerprint (``engine/fingerprint.py``) names everything that changes the
KV values, so a folder is only ever read by the model that wrote it.

- ``files``: what mlxd writes and may delete (atomic writes; deletion of its
  own file names only, never through a symlink);
- ``folder``: one fingerprint's folder (``CacheStore``: manifest, entries);
- ``bound``: the cache dir's total bound, safe for several daemons sharing it;
- ``persistence``: a save or restore of one engine's cache, between the MLX
  worker and a file thread.
"""
