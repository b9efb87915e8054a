from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from .models import User

# alwayson's admin picks an inbox's owner by autocomplete: the user model needs an admin
# with search_fields (UserAdmin's).
admin.site.register(User, UserAdmin)
