"""A run's report: the text for stdout, report.md, and the headline figures as one JSON object."""
