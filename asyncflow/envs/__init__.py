"""Environments for multi-turn rollouts (docs/environments.md): the interface, tools
as plain functions, and the calc example."""

from asyncflow.envs.base import Action, Environment, Observation, Sample, Step, load_env_factory
from asyncflow.envs.tools import ToolEnvironment, tool_format

__all__ = ["Action", "Environment", "Observation", "Sample", "Step", "ToolEnvironment", "load_env_factory", "tool_format"]
