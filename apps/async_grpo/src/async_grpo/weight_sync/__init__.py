"""weight_sync"""
