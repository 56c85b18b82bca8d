"""What Locust's web UI and HTML report gain: the start form arranged from the settings'
declarations, the Latency (HDR) and Last run tabs, the chart over time, the section of the HTML
report, the script the page loads."""
