"""Environments from other libraries as asyncflow environments (docs/environments.md,
"Hub environments"): ``openenv`` (openenv-core) and ``verifiers`` (prime-rl's). Each
module imports its library only when used: ``pip install 'asyncflow[hub]'``. The
gymnasium-style adapter needs no library: ``asyncflow.envs.gym``."""
