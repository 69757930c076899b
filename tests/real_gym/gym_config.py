"""Resolve a Gym config the way ``gym env start`` does, in the Gym venv.

    python gym_config.py < initial.json > resolved.yaml

Reads the servers' blocks as JSON on stdin and prints the global config YAML that Gym's own
``GlobalConfigDictParser`` makes of them (host 127.0.0.1 and a free port for each server,
the head server block, the defaults): what Gym hands each server in ``NEMO_GYM_CONFIG_DICT``.
"""

import json
import sys

from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
from omegaconf import OmegaConf


def main() -> None:
    initial = OmegaConf.create(json.load(sys.stdin))
    parsed = GlobalConfigDictParser().parse(
        GlobalConfigDictParserConfig(
            initial_global_config_dict=initial, skip_load_from_cli=True, skip_load_from_dotenv=True
        )
    )
    sys.stdout.write(OmegaConf.to_yaml(parsed))


if __name__ == "__main__":
    main()
