"""Run NeMo Gym 0.7.0's own rollout collection against running servers, in the Gym venv.

    NEMO_GYM_CONFIG_DICT=<global config yaml> python collect.py INPUT.jsonl OUTPUT.jsonl AGENT

``RolloutCollectionHelper.run_from_config`` is what ``gym eval`` / ``ng_collect_rollouts``
run: it posts each row to the agent's environment server's ``/run``, writes successes (and
judge-failed rows, masked) to OUTPUT.jsonl and failed ``/run`` calls to the
``OUTPUT_failures.jsonl`` sidecar (``route_failures_to_sidecar``). With the global config in
the environment, Gym reads it from there, as in a process Gym spawned, and needs no head
server.
"""

import asyncio
import sys

from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper


def main() -> None:
    input_path, output_path, agent_name = sys.argv[1:4]
    config = RolloutCollectionConfig(
        input_jsonl_fpath=input_path,
        output_jsonl_fpath=output_path,
        agent_name=agent_name,
        route_failures_to_sidecar=True,
        num_samples_in_parallel=1,
    )
    asyncio.run(RolloutCollectionHelper().run_from_config(config))


if __name__ == "__main__":
    main()
