"""What is sent and when: arrival schedules, time-varying rate profiles and the workload each
request is built from."""
