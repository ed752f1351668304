"""Object stores: local disk and S3 behind one small interface."""
