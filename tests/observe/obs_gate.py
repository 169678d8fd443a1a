"""A reward function that holds the run at its first call until a gate file exists.

Imported by the reward process (its directory is put on PYTHONPATH by the tests):
``OBS_GATE`` names the gate file. While it is absent no sample gets a reward, so no
trainer step completes: the cluster stays up for `afctl status` and the driver's
hang report fires, naming reward.0 and showing this function in its stack.
"""

import os
import time


def gated_reward(prompts, responses, answers, finish_reasons):
    gate = os.environ["OBS_GATE"]
    while not os.path.exists(gate):  # a child process cannot wait on the test's events: poll the file
        time.sleep(0.05)
    return [0.0] * len(responses)
