"""A verifiers (v1) game for tests/envs/test_verifiers_adapter.py, in the shape of
verifiers' TextArena and OpenEnv tasksets: a prompt-less task whose Env opens the
exchange and answers each move (``agents.player.interaction``), recording the game's
reward on the trace; the task adds a reward of its own (a shaping bonus for short games)."""

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=0.5)
    async def quick(self, trace) -> float:
        return float(trace.num_turns <= 2)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for i in range(5):
            yield GuessTask(GuessData(name=f"guess#{i}", secret=i + 2), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        won = 0.0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn(f"guess my number, 0..9 ({task.data.name})")
            while not segment.terminated:
                guess = segment.last_reply
                if guess == str(task.data.secret):
                    won = 1.0
                    break
                segment = await interaction.turn("higher" if guess < str(task.data.secret) else "lower")
        interaction.trace.record_reward("game", won)


__all__ = ["GuessTaskset", "GuessEnv"]
