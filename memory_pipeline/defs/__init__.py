"""Dagster wiring only: assets, partitions, resources, sensors, schedules."""
