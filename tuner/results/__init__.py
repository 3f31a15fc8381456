"""What a run writes and reads back: the results directory (``directory``), the summary
(``summary``), reports and plots (``report``, ``shared_report``) and the tuned-kernels export (``export``)."""
