"""The elastic scenario: HPA-scaled GPU deployments on the openb trace's real timeline.

Run ``python -m benchmarks.elastic`` (``--quick`` for a smoke run); see ``docs/elastic.md``.
"""
