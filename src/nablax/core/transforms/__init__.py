"""Transforms: interpreters over the recorded graph (jvp, vjp/grad, custom_vjp; later vmap, compile,
shard_map)."""
