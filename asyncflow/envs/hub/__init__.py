"""Environments from other libraries as asyncflow environments (docs/environments.md,
"Hub environments"): ``openenv`` (openenv-core) and ``verifiers`` (prime-rl's). Each
module imports its library only when used: ``pip install -e '.[hub]' (in the asyncflow checkout)``. The
gymnasium-style adapter needs no library: ``asyncflow.envs.gym``."""
