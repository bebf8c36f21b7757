"""The config: its schema (one source of defaults), Hydra composition, the ConfigStore nodes,
composition errors explained, the YAML reader. Imports no torch."""
