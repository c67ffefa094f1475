"""`async-grpo report`: one HTML page from a run's metrics and trace (plotly figures,
utilization).
"""
