"""What any algorithm's update stands on: the Algorithm interface, the batch on the device, the data-parallel reducer, the guarded optimizer step and the input-health figure."""
