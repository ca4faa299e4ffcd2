"""The Streamlit dashboard of DAPO Lab: it reads the store through db/ and asks Prefect to rerun
an arm. Pages are in dashboard/views/, data shaping in small plain modules beside them."""
