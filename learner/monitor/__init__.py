"""What the learner reports: metrics records and their log, Prometheus, TensorBoard, the progress line, health checks, the stall watch, evaluation results."""
