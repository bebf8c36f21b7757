"""The config: its schema (one source of defaults), validation, the frozen config.yaml, its layers
and their Hydra composition, the ConfigStore nodes, composition errors explained, the YAML
reader. Imports no torch."""
