"""observability/report"""
