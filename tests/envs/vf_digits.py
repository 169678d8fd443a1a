"""A verifiers (v1) taskset for tests/envs/test_verifiers_adapter.py: "say 3" -> "3",
scored by a task reward on the trace (the plain single-agent case)."""

import verifiers.v1 as vf


class DigitData(vf.TaskData):
    answer: str


class DigitTask(vf.Task[DigitData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class DigitTaskset(vf.Taskset[DigitTask, vf.TasksetConfig]):
    def load(self):
        for i in range(10):
            yield DigitTask(DigitData(prompt=f"say {i}", system_prompt="digits only", answer=str(i)), self.config.task)


__all__ = ["DigitTaskset"]
