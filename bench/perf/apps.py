from django.apps import AppConfig


class PerfConfig(AppConfig):
    name = "bench.perf"
    label = "perf"
